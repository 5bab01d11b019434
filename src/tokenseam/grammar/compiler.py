"""GrammarCompiler: front end -> IR -> byte NFA -> checked, trimmed NFA -> lazy automaton, with an LRU of compiled grammars.

The cache key is the grammar kind, its canonical text, the options and the vocabulary fingerprint. The cache
holds at most `cache_size` grammars, and the compiler's grammars (cached or in use) at most `cache_bytes`
bytes, automata and masks grown by requests included (memory.py).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ..vocab import Vocabulary
from . import cpkernels
from .automaton import Automaton
from .budget import compile_budget
from .compiled import CompiledGrammar
from .errors import GrammarEmpty, GrammarError
from .ir import Grammar, alt, lit
from .matcher import GrammarMatcher
from .memory import DEFAULT_BUDGET_MB, MB, GrammarMemory
from .nfa import build_nfa
from .prepare import prepare_nfa
from .regex import parse_regex, python_classes
from .tables import TokenTable

MAX_CHOICE_CHARS = 200_000
DEFAULT_CACHE_BYTES = DEFAULT_BUDGET_MB * MB


def token_table(vocab: Vocabulary) -> TokenTable:
    """The vocabulary's token table, built once per vocabulary and shared by every grammar on it."""
    return vocab.derived("grammar.token_table", lambda: TokenTable(vocab))


def loads_schema(text: str, what: str) -> Any:
    """Parse a schema given as JSON text; errors name `what`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise GrammarError(f"{what} is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise GrammarError(f"{what} is nested too deeply") from exc


class GrammarCompiler:
    """Compile JSON Schema, regex, GBNF and choice lists for one vocabulary (results cached, LRU).

    Each compile has one budget (budget.py): `time_budget` seconds of wall clock and `size_budget` units of
    data (None: the module defaults, budget.COMPILE_SECONDS and COMPILE_SIZE). Past either, the compile
    stops with a GrammarError naming the limit and where it ran out. `rss_limit`: bytes of resident memory the
    process may reach; past it a compile stops (or does not start) with GrammarResourceError.
    `python_builder`: automaton states are built only by the Python reference code, never by the numba
    builder (for tests that compare the two; much slower).

    `cache_bytes`: the memory budget of this compiler's grammars, cached or in use, in bytes (default
    DEFAULT_CACHE_BYTES, 256 MB): past it, unused grammars are evicted (LRU), then grammars in use stop
    memoising masks, then start over (memory.py); no request fails for it. 0 keeps nothing between requests
    and memoises nothing: exact, but every mask is walked afresh (for measuring, not serving).
    `memory_stats()` reports what is held."""

    def __init__(
        self,
        vocab: Vocabulary,
        cache_size: int = 128,
        time_budget: float | None = None,
        size_budget: int | None = None,
        rss_limit: int | None = None,
        python_builder: bool = False,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ValueError(f"cache_bytes must be a whole number of bytes >= 0, got {cache_bytes!r}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be a whole number >= 0, got {cache_size!r}")
        self.vocab = vocab
        self.table = token_table(vocab)
        self.cache_size = cache_size
        self.time_budget = time_budget
        self.size_budget = size_budget
        self.rss_limit = rss_limit  # the process's resident-memory cap in bytes (None: none)
        self.python_builder = python_builder
        self._cache: OrderedDict[tuple, CompiledGrammar] = OrderedDict()
        self._lock = threading.RLock()
        self.memory = GrammarMemory(cache_bytes, self._lock, self._cache)

    @property
    def cache_bytes(self) -> int:
        return self.memory.budget

    def memory_stats(self) -> dict[str, int]:
        """What this compiler's grammars hold: `bytes` (cached or in use, estimated), `budget_bytes`,
        `cached_grammars`, `live_grammars` (cached or in use), `evictions` (grammars evicted to keep the
        budget), `renewals` (grammars in use started over), `unmemoised_masks` (masks computed and not
        kept because the budget was spent), `gss_fallbacks` (requests moved to the exact GSS parser because
        their grammar left more parses open than the automaton keeps)."""
        with self._lock:
            return {"cached_grammars": len(self._cache), **self.memory.stats()}

    def clear_cache(self) -> int:
        """Drop every cached grammar; how many were dropped. A grammar a matcher still uses stays alive for it
        (and in `memory_stats` until it is freed); the next compile of its source builds it again."""
        with self._lock:
            n = len(self._cache)
            self._cache.clear()
            return n

    def _cached(self, key: tuple, build: Callable[[], tuple[Grammar, str, str]]) -> CompiledGrammar:
        full = key + (self.vocab.fingerprint,)
        with self._lock:
            hit = self._cache.get(full)
            if hit is not None:
                self._cache.move_to_end(full)
                return hit
        try:
            with compile_budget(self.time_budget, self.size_budget, self.rss_limit):
                grammar, kind, source = build()
                warnings = list(grammar.warnings)
                explain = grammar.explain_empty
                nfa = build_nfa(grammar)
                del grammar  # the IR is freed here, before the collector can see it
                auto = Automaton(_prepared(nfa, explain), self.table, self.python_builder)
        except RecursionError as exc:
            raise GrammarError("grammar nesting too deep") from exc
        compiled = CompiledGrammar(kind, source, auto, self.vocab, warnings)
        with self._lock:
            self._cache[full] = compiled
            while len(self._cache) > self.cache_size:
                if not self.memory.evict_unused():
                    self._cache.popitem(last=False)
                    self.memory.evictions += 1
            self.memory.add(compiled)
        return compiled

    def compile_regex(self, pattern: str) -> CompiledGrammar:
        return self._cached(*_plan_regex(pattern))

    def compile_choice(self, choices: list[str] | tuple[str, ...]) -> CompiledGrammar:
        return self._cached(*_plan_choice(choices))

    def compile_gbnf(self, text: str, start: str = "root") -> CompiledGrammar:
        return self._cached(*_plan_gbnf(text, start))

    def compile_json_schema(self, schema: Any, **options: Any) -> CompiledGrammar:
        """Options: strict (no extra properties), lenient (ignore unsupported keywords with a warning),
        compact (no whitespace), max_ws (longest run of spaces/tabs after a newline, default 40),
        property_order ("schema": declared properties in schema order, the default; "any": in any order,
        each at most once)."""
        return self._cached(*_plan_json_schema(schema, options))

    def compile_tool_answer(self, call_schema: Any, mode: str, parallel: bool = True) -> CompiledGrammar:
        """An answer that may call tools (see grammar/tools.py): `call_schema` is one call's JSON Schema
        (`tool_call_schema`; None for mode `none`), `mode` auto, required or none."""
        return self._cached(*_plan_tool_answer(call_schema, mode, parallel))

    def warm_up(self) -> None:
        """Load every numba function that masks and commits use, so that no request waits for it: numba loads
        each one from its on-disk cache (or compiles it, on a first run) at its first call, 10-40 ms apiece.
        Two small grammars cover them all: any JSON value (rule calls, positions split by call frame, tokens
        that leave a called rule) and a counted array of counted strings. Masks and commits run over a short
        document of each. Nothing is added to this compiler's cache.

        Also paid here, once per process, instead of by the first schema that needs them (about 50-60 ms each):
        the code point ranges of Python's \\d \\w \\s (regex.python_classes scans every code point) and the
        jsonschema package, which enum and const values are checked with."""
        import jsonschema  # noqa: F401

        python_classes()
        cpkernels.warm_up()
        scratch = GrammarCompiler(self.vocab, cache_size=1, cache_bytes=self.cache_bytes)
        out = np.zeros(self.vocab.mask_words, dtype=np.int32)
        for schema, doc in (
            ({}, '{"a": [1, {"b": "x y"}], "c": -2.5e3, "d": [true, null]}'),
            (
                {"type": "array", "maxItems": 20, "items": {"type": "string", "maxLength": 30}},
                '["ab", "c d", "e"]',
            ),
        ):
            m = GrammarMatcher(scratch.compile_json_schema(schema))
            for ch in doc:
                m.fill_next_token_bitmask(out)
                m.accept_bytes(ch.encode())
        # The one builder these documents do not reach: rebuilding the state index, as a large automaton grows.
        auto = m.compiled.automaton
        auto._fast.rehash(auto)


# -- what each kind compiles from: (cache key, IR builder), shared by the compiler and check_grammar -------------
def _prepared(nfa, explain: Callable[[], str | None] | None):
    """The grammar's byte automaton, checked and trimmed (prepare_nfa); a grammar that accepts nothing is an
    error saying which part accepts nothing, where its front end can tell (`explain`: Grammar.explain_empty)."""
    try:
        return prepare_nfa(nfa)
    except GrammarEmpty as exc:
        why = explain() if explain is not None else None
        if why is None:
            raise
        raise GrammarEmpty(why) from exc


_Plan = tuple[tuple, Callable[[], tuple[Grammar, str, str]]]


def _plan_regex(pattern: str) -> _Plan:
    if not isinstance(pattern, str):
        raise GrammarError(f"regex must be a string, got {type(pattern).__name__}")

    def build():
        return Grammar({"root": parse_regex(pattern)}, "root"), "regex", pattern

    return ("regex", pattern), build


def _plan_choice(choices: list[str] | tuple[str, ...]) -> _Plan:
    if not isinstance(choices, (list, tuple)) or not choices:
        raise GrammarError("choice must be a non-empty list of strings")
    for k, c in enumerate(choices):
        if not isinstance(c, str):
            raise GrammarError(f"choice[{k}] must be a string, got {type(c).__name__}")
    total = sum(len(c) for c in choices)
    if total > MAX_CHOICE_CHARS:
        raise GrammarError(f"choice list too large ({total} characters, limit {MAX_CHOICE_CHARS})")
    source = json.dumps(list(choices), ensure_ascii=False)

    def build():
        return Grammar({"root": alt(*[lit(c) for c in choices])}, "root"), "choice", source

    return ("choice", source), build


def _plan_gbnf(text: str, start: str = "root") -> _Plan:
    from .gbnf import parse_gbnf

    if not isinstance(text, str):
        raise GrammarError(f"GBNF grammar must be a string, got {type(text).__name__}")

    def build():
        return parse_gbnf(text, start), "gbnf", text

    return ("gbnf", text, start), build


def _plan_tool_answer(call_schema: Any, mode: str, parallel: bool) -> _Plan:
    from .json_schema import schema_to_grammar
    from .tools import tool_answer_grammar

    try:
        source = json.dumps(
            {"call": call_schema, "mode": mode, "parallel": bool(parallel)}, ensure_ascii=False
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise GrammarError(f"the tools' schemas are not JSON-serialisable: {exc}") from exc

    def build():
        call = None if mode == "none" else schema_to_grammar(call_schema, strict=True, compact=True)
        return tool_answer_grammar(call, mode, bool(parallel)), "tool_calls", source

    return ("tool_calls", source), build


_JSON_DEFAULTS = {
    "strict": False,
    "lenient": False,
    "compact": False,
    "max_ws": 40,
    "property_order": "schema",
}


def _plan_json_schema(schema: Any, options: dict[str, Any]) -> _Plan:
    from .json_schema import schema_to_grammar

    if isinstance(schema, str):
        schema = loads_schema(schema, "JSON schema")
    try:
        # The cache key (ASCII escapes and no cycle check are the encoder's fast path: a schema that holds
        # itself is then refused as nested too deeply).
        source = json.dumps(schema, check_circular=False)
    except RecursionError as exc:
        raise GrammarError("JSON schema is nested too deeply") from exc
    except (TypeError, ValueError) as exc:
        raise GrammarError(f"JSON schema is not JSON-serialisable: {exc}") from exc
    # An option spelled out at its default is the same grammar: one cache entry.
    keyed = {k: v for k, v in options.items() if not (k in _JSON_DEFAULTS and v == _JSON_DEFAULTS[k])}
    okey = json.dumps(keyed, sort_keys=True, default=str)

    def build():
        return schema_to_grammar(schema, **options), "json_schema", source

    return ("json_schema", source, okey), build


def check_grammar(
    kind: str,
    payload: Any,
    time_budget: float | None = None,
    size_budget: int | None = None,
    **options: Any,
) -> list[str]:
    """Everything a compile checks that does not depend on a vocabulary: the front end, the byte NFA and its
    checks, under the same budget. Raises the GrammarError a compile would; returns the warnings.

    `kind`: "json_schema" (options as `compile_json_schema`), "regex", "gbnf" or "choice". For a process
    that validates requests before another compiles them (vLLM's front end)."""
    plans = {
        "json_schema": lambda: _plan_json_schema(payload, options),
        "regex": lambda: _plan_regex(payload),
        "gbnf": lambda: _plan_gbnf(payload),
        "choice": lambda: _plan_choice(payload),
    }
    if kind not in plans:
        raise GrammarError(f"unknown grammar kind {kind!r} (use {', '.join(plans)})")
    if options and kind != "json_schema":
        raise GrammarError(f"{kind} grammars take no options")
    _, build = plans[kind]()
    try:
        with compile_budget(time_budget, size_budget):
            grammar, _, _ = build()
            warnings = list(grammar.warnings)
            _prepared(build_nfa(grammar), grammar.explain_empty)
    except RecursionError as exc:
        raise GrammarError("grammar nesting too deep") from exc
    return warnings
