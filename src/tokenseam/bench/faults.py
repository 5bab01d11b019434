"""The fault set: malformed request bodies and hostile grammars that a server must answer with a 4xx (or serve).

`malformed_cases()` enumerates bodies per route (each field given values of the wrong type, out of range,
hostile strings, plus whole-body faults); `hostile_grammars()` the grammars that cost unbounded time or memory
without a budget. The fuzz test and `tokenseam bench chaos` replay them.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
LLAMA = "/completion"


@dataclass(frozen=True)
class Case:
    route: str
    body: bytes
    what: str
    content_type: str = "application/json"


def _bases() -> dict[str, dict]:
    return {
        CHAT: {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0},
        COMPLETIONS: {"prompt": "Hello", "max_tokens": 2, "temperature": 0},
        LLAMA: {"prompt": "Hello", "n_predict": 2, "temperature": 0},
    }


_COMMON = [
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "stream",
    "token_healing",
    "ignore_eos",
    "json_schema_options",
]
FIELDS = {
    CHAT: _COMMON
    + [
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "logprobs",
        "top_logprobs",
        "stream_options",
        "return_token_ids",
        "stop_token_ids",
        "response_format",
        "tools",
        "tool_choice",
        "guided_json",
        "guided_regex",
        "guided_grammar",
        "guided_choice",
        "grammar_after_think",
        "user",
    ],
    COMPLETIONS: _COMMON
    + [
        "prompt",
        "max_tokens",
        "n",
        "logprobs",
        "echo",
        "suffix",
        "best_of",
        "stream_options",
        "return_token_ids",
        "guided_json",
        "guided_regex",
        "guided_choice",
    ],
    LLAMA: _COMMON + ["prompt", "n_predict", "n_probs", "return_tokens", "grammar", "json_schema"],
}

# Values of the wrong type, at the edges of number ranges, and strings that break encoders. Lone surrogates
# go in as JSON escapes (valid JSON text, not valid UTF-8 once decoded).
_SURROGATE = "\ud800"
BAD_VALUES: list = [
    None,
    True,
    False,
    0,
    -1,
    1 << 63,
    -(1 << 63),
    1e308,
    -1e308,
    5e-324,
    -0.0,
    3.5,
    "",
    "yes",
    "1",
    _SURROGATE,
    "x\udfffy",
    "a" * 20_000,
    [],
    [1, 2],
    [None],
    [_SURROGATE],
    {},
    {"a": 1},
    {"type": 5},
    {"type": "json_schema", "json_schema": {"schema": {"$ref": "http://127.0.0.1:9/x.json"}}},
]


def _nest(depth: int, kind: str = "[") -> str:
    close = {"[": "]", "{": "}"}[kind]
    if kind == "[":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + close * depth


def _dumps(obj) -> bytes:
    # ensure_ascii keeps lone surrogates as \ud800 escapes, which is what a hostile client would send
    return json.dumps(obj, ensure_ascii=True).encode()


def _body_faults(route: str, base: dict) -> list[Case]:
    ok = _dumps(base)
    raw = [
        (b"", "empty body"),
        (b"   ", "blank body"),
        (b"null", "null"),
        (b"[]", "array"),
        (b'"x"', "string"),
        (b"1", "number"),
        (b"{", "truncated"),
        (ok + b"x", "trailing garbage"),
        (b"\xff\xfe{}", "invalid UTF-8"),
        (ok[:-1] + b',"temperature":NaN}', "NaN literal"),
        (ok[:-1] + b',"top_p":Infinity}', "Infinity literal"),
        (ok[:-1] + b',"temperature":1e999}', "overflowing number"),
        (ok[:-1] + b',"\\ud800":1}', "surrogate key"),
        (ok[:-1] + b',"x":"\\udc00\\ud800"}', "reversed surrogates"),
        (_nest(10_000).encode(), "array nested 10,000 deep"),
        (_nest(10_000, "{").encode(), "object nested 10,000 deep"),
        (ok[:-1] + b',"x":' + _nest(5_000).encode() + b"}", "field nested 5,000 deep"),
        (ok[:-1] + b',"x":' + _nest(100_000).encode() + b"}", "field nested 100,000 deep"),
        (b'{"a":1,' * 1 + b'"a":2}', "duplicate keys"),
    ]
    out = [Case(route, body, what) for body, what in raw]
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "", "multipart/form-data; boundary=x"):
        out.append(Case(route, ok, f"content-type {ctype or 'missing'}", ctype))
    return out


def malformed_cases(routes: tuple[str, ...] = (CHAT, COMPLETIONS, LLAMA)) -> list[Case]:
    """Every field of every route with every bad value, plus whole-body faults (deterministic order)."""
    out: list[Case] = []
    bases = _bases()
    for route in routes:
        base = bases[route]
        out += _body_faults(route, base)
        for name in FIELDS[route]:
            for v in BAD_VALUES:
                body = dict(base)
                body[name] = v
                out.append(Case(route, _dumps(body), f"{name}={_short(v)}"))
        # messages with bad parts
        if route == CHAT:
            for m in (
                [{"role": "user"}],
                [{"role": "bot", "content": "x"}],
                [{"role": "user", "content": 5}],
                [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}],
                    }
                ],
                [{"role": "user", "content": _SURROGATE}],
                [{"role": "assistant", "content": None}],
                ["x"],
            ):
                out.append(Case(route, _dumps({**base, "messages": m}), f"messages={_short(m)}"))
    return out


def sample_cases(n: int, seed: int = 0, routes: tuple[str, ...] = (CHAT, COMPLETIONS, LLAMA)) -> list[Case]:
    """A seeded sample of `n` cases (all of them when n is larger)."""
    cases = malformed_cases(routes)
    if n >= len(cases):
        return cases
    return random.Random(seed).sample(cases, n)


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def allof_tree(n: int = 40) -> dict:
    """The issue's case: d_i = allOf [d_i+1, d_i+1], so d0 stands for 2**40 copies of an integer schema."""
    defs = {
        f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(n)
    }
    defs[f"d{n}"] = {"type": "integer"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def gbnf_chain(shape: str, n: int = 10_000) -> str:
    """A chain of n rules, root -> r0 -> r1 -> ... -> r_n, in several shapes."""
    body = {
        "left": ('r{i} ::= r{j} "a"', 'r{n} ::= "a"'),
        "right": ('r{i} ::= "a" r{j}', 'r{n} ::= "a"'),
        "alt": ('r{i} ::= r{j} | "a"', 'r{n} ::= "a"'),
        "double": ("r{i} ::= r{j} r{j}", 'r{n} ::= "a"'),
        "cyclic": ('r{i} ::= "a" r{j} | "b"', 'r{n} ::= "a" r0 | "b"'),
        "left-recursive": ('r{i} ::= r{j} "a" | "b"', 'r{n} ::= r0 "a" | "b"'),
        "nullable": ('r{i} ::= r{j} "a" | ""', 'r{n} ::= "b" r0 | ""'),
    }[shape]
    rules = [body[0].format(i=i, j=i + 1) for i in range(n)]
    return "root ::= r0\n" + "\n".join(rules) + "\n" + body[1].format(n=n)


def hostile_grammars() -> list[tuple[str, dict]]:
    """(name, request fields) of grammars that take unbounded time or memory without a compile budget."""
    chain = gbnf_chain("left")
    doubling = gbnf_chain("double", 40)
    anyofs = {
        "allOf": [
            {"anyOf": [{"type": "object", "properties": {f"p{i}{j}": {"type": "integer"}}} for j in range(8)]}
            for i in range(12)
        ]
    }
    return [
        ("allOf doubling through $defs", {"guided_json": allof_tree()}),
        ("10,000-rule GBNF chain", {"guided_grammar": chain}),
        ("GBNF doubling 2^40", {"guided_grammar": doubling}),
        ("allOf of anyOfs (8^12 branches)", {"guided_json": anyofs}),
        ("nested bounded repeats", {"guided_regex": "((a{1,100}){1,100}){1,100}"}),
        (
            "remote $ref",
            {"guided_json": {"enum": [{"a": 1}], "properties": {"a": {"$ref": "http://127.0.0.1:9/e.json"}}}},
        ),
        ("file $ref", {"guided_json": {"enum": [1], "properties": {"a": {"$ref": "file:///etc/passwd"}}}}),
        ("wrong-typed format", {"guided_json": {"type": "string", "format": 5}}),
    ]
