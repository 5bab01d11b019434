"""What a vLLM structured-output request asks for, in tokenseam's terms, and its checks (no vLLM needed).

vLLM hands a backend a request kind (`StructuredOutputOptions`: JSON, JSON_OBJECT, REGEX, GRAMMAR, CHOICE,
STRUCTURAL_TAG) and its text. `plan()` turns that into one of tokenseam's grammar kinds with its options;
`check()` runs every vocabulary-free compile check, so a bad grammar is a 400 when the request arrives,
never an engine error later; `compile_plan()` compiles it for a vocabulary.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from threading import Lock
from typing import Any

from ..grammar import CompiledGrammar, GrammarCompiler, GrammarError, check_grammar
from ..grammar.compiler import loads_schema
from ..grammar.request import NOT_GBNF
from .plugin import CACHE_MB_ENV, MAX_CACHE_MB


def grammar_cache_bytes(environ) -> int:
    """The backend's grammar budget in bytes: TOKENSEAM_GRAMMAR_CACHE_MB (whole MB, 0 to 1,048,576), else the
    grammar engine's default. A bad value is a ValueError naming the variable (vLLM then fails at start)."""
    from ..grammar.memory import DEFAULT_BUDGET_MB, MB

    text = environ.get(CACHE_MB_ENV)
    if text is None or not text.strip():
        return DEFAULT_BUDGET_MB * MB
    try:
        mb = int(text)
    except ValueError:
        raise ValueError(f"{CACHE_MB_ENV} must be a whole number of MB, got {text!r}") from None
    if not 0 <= mb <= MAX_CACHE_MB:
        raise ValueError(f"{CACHE_MB_ENV} must be between 0 and {MAX_CACHE_MB}, got {mb}")
    return mb * MB


# Request kinds by vLLM's enum member names (vllm.v1.structured_output.backend_types.StructuredOutputOptions).
KINDS = ("JSON", "JSON_OBJECT", "REGEX", "GRAMMAR", "CHOICE", "STRUCTURAL_TAG")

# The parameter a 400 names, per kind (the OpenAI body field vLLM reads it from).
PARAM = {
    "JSON": "structured_outputs.json",
    "JSON_OBJECT": "structured_outputs.json_object",
    "REGEX": "structured_outputs.regex",
    "GRAMMAR": "structured_outputs.grammar",
    "CHOICE": "structured_outputs.choice",
    "STRUCTURAL_TAG": "structured_outputs.structural_tag",
}


@dataclass(frozen=True)
class Plan:
    """One of tokenseam's grammar kinds ("json_schema", "regex", "gbnf", "choice"), its payload and options."""

    kind: str
    payload: Any
    options: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return json.dumps([self.kind, self.payload, self.options], sort_keys=True, ensure_ascii=False)


def plan(
    kind: str, spec: Any, strict: bool = False, compact: bool = False, property_order: str = "schema"
) -> Plan:
    """The grammar a vLLM request of `kind` with text `spec` asks for.

    `strict`: objects take no properties beyond those the schema lists (OpenAI's `strict: true`, vLLM's
    per-request `disable_additional_properties`); `compact`: no whitespace in JSON (vLLM's
    `disable_any_whitespace`); `property_order` "any": declared properties in any order (the request's
    `vllm_xargs.tokenseam_property_order`; other kinds have no objects and ignore it). Raises GrammarError for a kind or text the backend does not take."""
    options: dict[str, Any] = {}
    if strict:
        options["strict"] = True
    if compact:
        options["compact"] = True
    json_options = {**options, "property_order": property_order} if property_order != "schema" else options
    if kind == "JSON":
        if isinstance(spec, str):
            spec = loads_schema(spec, "the JSON schema")
        if not isinstance(spec, (dict, bool)):
            raise GrammarError("a JSON schema must be an object or a boolean")
        return Plan("json_schema", spec, json_options)
    if kind == "JSON_OBJECT":
        return Plan("json_schema", {"type": "object"}, json_options)
    if options:
        raise GrammarError(f"strict and compact apply to JSON only, not to {kind.lower()}")
    if kind == "REGEX":
        if not isinstance(spec, str):
            raise GrammarError("a regex must be a string")
        return Plan("regex", spec)
    if kind == "CHOICE":
        if isinstance(spec, str):
            spec = loads_schema(spec, "the choice list")
        if not isinstance(spec, list) or not spec or not all(isinstance(c, str) for c in spec):
            raise GrammarError("choice must be a non-empty list of strings")
        return Plan("choice", spec)
    if kind == "GRAMMAR":
        if not isinstance(spec, str) or not spec.strip():
            raise GrammarError("a grammar must be a non-empty string")
        if "::=" not in spec:
            raise GrammarError("the tokenseam backend " + NOT_GBNF)
        return Plan("gbnf", spec)
    if kind == "STRUCTURAL_TAG":
        raise GrammarError(
            "structural_tag is not supported by the tokenseam backend (use json, regex, choice or grammar)"
        )
    raise GrammarError(f"unknown structured output kind {kind!r}")


class Checker:
    """`check()` with a bounded memory of its verdicts, for a front end that sees the same grammar often: a
    repeated grammar costs a lookup, whether it passed or failed (a client resending a grammar that runs into
    the compile budget pays the budget once, not on every request)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._seen: OrderedDict[str, str | None] = OrderedDict()  # plan key -> error message, None = passed
        self._lock = Lock()

    def check(self, p: Plan) -> None:
        key = p.key
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                error = self._seen[key]
                if error is not None:
                    raise GrammarError(error)
                return
        error = None
        try:
            check_grammar(p.kind, p.payload, **p.options)
        except GrammarError as e:
            error = str(e)
        with self._lock:
            self._seen[key] = error
            while len(self._seen) > self.size:
                self._seen.popitem(last=False)
        if error is not None:
            raise GrammarError(error)


def compile_plan(compiler: GrammarCompiler, p: Plan) -> CompiledGrammar:
    """Compile `p` for the compiler's vocabulary (its LRU is keyed by grammar, options and vocabulary)."""
    if p.kind == "json_schema":
        return compiler.compile_json_schema(p.payload, **p.options)
    if p.kind == "regex":
        return compiler.compile_regex(p.payload)
    if p.kind == "gbnf":
        return compiler.compile_gbnf(p.payload)
    if p.kind == "choice":
        return compiler.compile_choice(p.payload)
    raise GrammarError(f"unknown grammar kind {p.kind!r}")
