"""The grammar of an answer that may call tools (`tool_choice` auto, required, a named function, or none).

The call format is `tokenseam.toolcalls`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, each call
one JSON object of `tool_call_schema(functions)` (compact, no undeclared properties, so arguments always end).

- `auto`: free text that never contains `<tool_call>`, then optionally calls. The text is not restricted in
  any other way; the first `<tool_call>` commits the rest of the answer to calls. This is the lazy grammar
  llama-server builds from triggers, written as one automaton: nothing outside the calls is constrained, and
  a call cannot start without the grammar holding it.
- `required` / a named function: one or more calls (one when `parallel_tool_calls` is false), nothing else.
- `none`: free text that never contains `<tool_call>` (the tools are shown, never called).
"""

from __future__ import annotations

from ..toolcalls import CLOSE, OPEN
from .cpauto import complement, determinize, from_ir, trim
from .errors import GrammarError
from .ir import ANY_RANGES, Auto, Chars, Grammar, Ref, lit, opt, seq, star

MODES = ("auto", "required", "none")
START = "tool_answer"


def free_text_without(marker: str) -> Auto:
    """Any text in which `marker` does not occur."""
    anything = star(Chars(ANY_RANGES))
    return Auto(trim(complement(determinize(from_ir(seq(anything, lit(marker), anything))))))


def tool_answer_grammar(call: Grammar | None, mode: str, parallel: bool) -> Grammar:
    """`call`: the grammar of one call's JSON (start rule `call.start`); None only for mode `none`."""
    if mode not in MODES:
        raise GrammarError(f"tool mode must be one of {', '.join(MODES)}")
    text = free_text_without(OPEN)
    if mode == "none":
        return Grammar({START: text}, START)
    if call is None:
        raise GrammarError("tool calls need the functions' grammar")
    if START in call.rules:
        raise GrammarError(f"rule name {START!r} is taken")
    # Laid out exactly as `toolcalls.call_text` renders a call back into a later prompt, so the history a
    # client sends back re-renders to the bytes generated and the turn memory gives back the generated ids.
    one = seq(lit(OPEN), Ref(call.start), lit(CLOSE))
    calls = seq(one, star(one)) if parallel else one
    root = seq(text, opt(calls)) if mode == "auto" else calls
    rules = {**call.rules, START: root}
    return Grammar(rules, START, list(call.warnings), call.shared, call.indent_limit)
