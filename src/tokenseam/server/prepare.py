"""Request preparation: a parsed request becomes an engine request (prompt ids, healing, constraint stack).

Runs in a preparation pool thread (tokenizing, the chat template and grammar compiles are slow enough to hold up
the event loop). `Prepared` carries what the response reports about how the request was built.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..engine import GenerationRequest
from ..healing import DEFAULT_MAX_ROLLBACK, heal_prompt, request_constraint
from .errors import APIError, known_error
from .protocol import ParsedRequest, bad, parse_llama_completion, parse_openai
from .state import ServerState

if TYPE_CHECKING:
    from ..constraint import Constraint
    from ..grammar.request import ToolRequest

GRAMMAR_FIELDS = (
    "response_format",
    "tools",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_grammar",
    "guided_choice",
    "grammar",
    "json_schema",
    "json_schema_options",
)


@dataclass
class Prepared:
    """An engine request plus what the response needs to report about how it was built."""

    gen: GenerationRequest
    prompt_tokens: int
    healed: dict | None = None  # {"removed_ids": [...], "removed_bytes": [...], "removed_text": ...}
    tool_call: ToolRequest | None = None  # set when the answer may hold tool calls
    grammar_warnings: list[str] = field(default_factory=list)  # what a lenient schema compile ignored
    # The turn memory's key for this prompt (chat prompts only), and what healing rolled back of it: the
    # answers are remembered under it when the request finishes (`remember_answers`).
    turn_key: bytes | None = None
    turn_removed: tuple[int, ...] = ()
    turn_lead: bytes = b""
    spliced: list = field(default_factory=list)  # earlier answers given back as their ids (SplicedAnswer)

    def report(self) -> dict:
        """The extension fields a response carries once (the first chunk when streaming)."""
        out: dict = {}
        if self.healed:
            out["token_healing"] = self.healed
        if self.grammar_warnings:
            out["grammar_warnings"] = self.grammar_warnings
        return out


def prepare(
    state: ServerState,
    parsed: ParsedRequest,
    body: dict,
    sent: dict | None = None,
    tenant: str = "",
    compiling: Future | None = None,
) -> Prepared:
    """Tokenize the prompt and build the engine request: grammar constraint, token healing, test hooks.
    `tenant`: whose earlier answers a chat prompt may take its ids from (the turn memory). `compiling`: the
    request's grammar, being compiled in another thread (`compile_request_grammar`); the engine then reads the
    prompt while it compiles, and the constraint is made once it is done (the caller sets
    `grammar_warnings` then). Not for a request whose grammar starts after a reasoning block."""
    if parsed.model is not None and parsed.model not in state.model_names:
        raise APIError(
            404,
            f"the model {parsed.model!r} does not exist; this server serves {state.model_id!r}",
            code="model_not_found",
            param="model",
        )
    tools = _tool_request(body, parsed.route)
    turn_key, spliced = None, []
    if parsed.messages is not None:
        enc = state.chat.encode_prompt(
            parsed.messages,
            parsed.add_generation_prompt,
            tools.tools if tools else None,
            continue_final=parsed.continue_final_message,
            kwargs=parsed.chat_template_kwargs,
            memory=state.turns,
            tenant=tenant,
        )
        ids, spliced = enc.ids, enc.spliced
        if state.turns is not None and enc.text is not None and parsed.add_generation_prompt:
            turn_key = state.turns.key(tenant, enc.text.encode("utf-8", "surrogatepass"))
    elif parsed.prompt_ids is not None:
        ids = parsed.prompt_ids
        if ids and (min(ids) < 0 or max(ids) >= state.vocab.size):
            raise bad(f"prompt token ids must be in 0..{state.vocab.size - 1}", "prompt")
    else:
        ids = state.tokenizer.encode(parsed.prompt_text or "", add_special=True, parse_special=False)
    turn_end = state.chat.turn_end_id if parsed.messages is not None else None
    # the hook sees the body as sent: the canonical one has no `_`-prefixed fields
    # calls are parsed out of the answer in every mode but none (whose grammar keeps them out)
    tool_call = tools if tools is not None and tools.mode != "none" else None
    hooked = state.constraint_hook(parsed, sent or body) if state.constraint_hook is not None else None
    if hooked is not None:  # an embedder's own constraint replaces grammar and healing
        gen = GenerationRequest(
            prompt_ids=list(ids),
            params=parsed.params,
            turn_end=turn_end,
            constraint_factory=hooked,
            prompt_logprobs=parsed.params.top_logprobs if parsed.echo and parsed.params.logprobs else None,
            explain_prefix=parsed.prefix_cache,
        )
        return Prepared(
            gen=gen, prompt_tokens=len(ids), tool_call=tool_call, turn_key=turn_key, spliced=spliced
        )
    compiled = state.compile_request_grammar(body, parsed.route) if compiling is None else None
    think = grammar_after_think(state, parsed, body)
    if not isinstance(think, bool):
        raise bad("grammar_after_think must be true or false", "grammar_after_think")
    if think and compiling is not None:
        raise ValueError("a grammar after a reasoning block is compiled before the prompt is read")
    think = think and compiled is not None
    healed = None
    removed = b""
    removed_ids: list[int] = []
    rollback = DEFAULT_MAX_ROLLBACK if parsed.token_healing is True else int(parsed.token_healing)
    if rollback and not think:  # the thinking text comes first: nothing to heal into
        hr = heal_prompt(ids, state.vocab, rollback)
        if hr.healed and len(hr.kept_ids) > 0:
            ids, removed, removed_ids = hr.kept_ids, hr.removed_bytes, hr.removed_ids
            healed = {
                "removed_ids": hr.removed_ids,
                "removed_bytes": list(removed),
                "removed_text": removed.decode("utf-8", errors="replace"),
            }
    reasoning_end = state.reasoning_end if think else None
    if compiling is None:
        factory = request_constraint(state.vocab, compiled, removed, reasoning_end=reasoning_end)
    else:
        factory = _once_compiled(
            compiling, lambda c: request_constraint(state.vocab, c, removed, reasoning_end)
        )
    gen = GenerationRequest(
        prompt_ids=list(ids),
        params=parsed.params,
        turn_end=turn_end,
        constraint_factory=factory,
        constraint_pending=compiling,
        text_skip_bytes=len(removed),
        prompt_logprobs=parsed.params.top_logprobs if parsed.echo and parsed.params.logprobs else None,
        explain_prefix=parsed.prefix_cache,
    )
    return Prepared(
        gen=gen,
        prompt_tokens=len(ids),
        healed=healed,
        tool_call=tool_call,
        grammar_warnings=list(compiled.warnings) if compiled is not None else [],
        turn_key=turn_key,
        turn_removed=tuple(removed_ids),
        turn_lead=removed,
        spliced=spliced,
    )


def grammar_after_think(state: ServerState, parsed: ParsedRequest, body: dict):
    """Whether the request's grammar starts after a reasoning block: its `grammar_after_think`, else whether a
    thinking model's chat template renders the prompt (a value that is not a bool is the caller's 400)."""
    return body.get("grammar_after_think", state.chat.is_thinking and parsed.messages is not None)


def _once_compiled(compiling: Future, make: Callable) -> Callable[[], Constraint | None]:
    """A constraint factory for a grammar still compiling: the first call (once `compiling` is done; the engine
    makes sure of that) takes the grammar, or raises its compile error, and builds the real factory."""
    made: list = []

    def factory() -> Constraint | None:
        if not made:
            made.append(make(compiling.result(timeout=0)))
        return made[0]() if made[0] is not None else None

    return factory


def remember_answers(state: ServerState, prep: Prepared, choices) -> None:
    """Keep a finished chat request's answers (their generated ids) in the turn memory, under its prompt."""
    if state.turns is None or prep.turn_key is None:
        return
    from ..engine.turn_memory import make_answer

    v = state.vocab
    for c in choices:
        if c.finish_reason in (None, "abort"):
            continue
        answer = make_answer(c.token_ids, v.token_bytes, v.is_special, prep.turn_removed, prep.turn_lead)
        if answer is not None:
            state.turns.put(prep.turn_key, answer)


def _tool_request(body: dict, route: str) -> ToolRequest | None:
    from ..grammar.request import tool_request

    try:
        return tool_request(body, route)
    except Exception as e:
        if (err := known_error(e)) is None:
            raise
        raise err from e


def wants_grammar(body: dict) -> bool:
    """Whether the request asks for a grammar (it is then prepared in the grammar pool)."""
    return any(body.get(k) not in (None, "", [], {}) for k in GRAMMAR_FIELDS)


def parse_request(route: str, body: dict) -> ParsedRequest:
    """The body checked and parsed for its route (raises APIError)."""
    return parse_llama_completion(body) if route == "/completion" else parse_openai(body, route)
