"""Constraint fields in each upstream's dialect: translated where the upstream has the same constraint under
another name, refused (400, naming the field) where it would drop it without an error.

Clients send constraints in several dialects: vLLM's older `guided_*` fields (vLLM 0.12+ ignores them
silently), vLLM's `structured_outputs`, llama-server's `json_schema` / `grammar`, SGLang's `json_schema` /
`regex` / `ebnf`. A request names at most one. `translate(kind, route, body)` rewrites it for the replica it
goes to:

| constraint      | vllm                      | sglang             | llama-server        | openai (hosted)          |
|-----------------|---------------------------|--------------------|---------------------|--------------------------|
| JSON Schema     | structured_outputs.json   | json_schema (text) | json_schema         | response_format (chat)   |
| regex           | structured_outputs.regex  | regex              | refused             | refused                  |
| choice          | structured_outputs.choice | regex (a|b)        | grammar (GBNF)      | refused                  |
| GBNF grammar    | structured_outputs.grammar| ebnf               | grammar             | refused                  |
| JSON object     | structured_outputs.json_object | response_format | response_format   | response_format (chat)   |

`response_format` passes unchanged everywhere (every dialect takes it); a tokenseam upstream takes every
dialect itself (and refuses what it cannot honour), so its requests pass unchanged. vLLM's options
(`whitespace_pattern`, `disable_any_whitespace`, `disable_additional_properties`, ...) reach vLLM only;
elsewhere they are refused. `guided_decoding_backend` chooses an engine, not a language: vLLM 0.12+ picks
its backend per server, so the field is removed and the translation says so.
"""

from __future__ import annotations

import json
from typing import Any

# The fields a client may name a constraint with: field -> constraint kind.
GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
NATIVE = {"json_schema": "json", "grammar": "grammar", "regex": "regex", "ebnf": "grammar"}
OPTION_FIELDS = ("guided_whitespace_pattern",)
SO_KINDS = ("json", "regex", "choice", "grammar", "json_object")
_REGEX_META = set("\\^$.|?*+()[]{}/")


class FieldError(ValueError):
    """A constraint field this upstream would drop: 400 naming it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _constraint(body: dict[str, Any]) -> tuple[str, str, Any, dict[str, Any]] | None:
    """(field, kind, value, options) of the one constraint the body names, or None. Raises FieldError."""
    found: list[tuple[str, str, Any]] = []
    options: dict[str, Any] = {}
    for field, kind in GUIDED.items():
        if body.get(field) is not None:
            found.append((field, kind, body[field]))
    for field, kind in NATIVE.items():
        if body.get(field) is not None:
            found.append((field, kind, body[field]))
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise FieldError("structured_outputs", "structured_outputs: must be an object")
        kinds = [k for k in SO_KINDS if so.get(k) not in (None, False)]
        if len(kinds) != 1:
            raise FieldError(
                "structured_outputs",
                f"structured_outputs: name exactly one of {', '.join(SO_KINDS)} (got {', '.join(kinds) or 'none'})",
            )
        found.append(("structured_outputs", kinds[0], so[kinds[0]]))
        options = {k: v for k, v in so.items() if k not in SO_KINDS and v is not None}
    if body.get("guided_whitespace_pattern") is not None:
        options["whitespace_pattern"] = body["guided_whitespace_pattern"]
    if len(found) > 1:
        raise FieldError(
            found[1][0],
            f"{' and '.join(f[0] for f in found)}: a request may name one constraint, not several",
        )
    if not found:
        if options:
            name = (
                "guided_whitespace_pattern"
                if "whitespace_pattern" in options and so is None
                else "structured_outputs"
            )
            raise FieldError(name, f"{name}: an option without a constraint to apply it to")
        return None
    field, kind, value = found[0]
    if isinstance(body.get("response_format"), dict) and body["response_format"].get("type") not in (
        None,
        "text",
    ):
        raise FieldError(
            field, f"{field} and response_format: a request may name one constraint, not several"
        )
    if kind == "json" and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise FieldError(field, f"{field}: not a JSON Schema (the string is not JSON)") from None
    if kind == "json" and not isinstance(value, (dict, bool)):
        raise FieldError(field, f"{field}: a JSON Schema is an object")
    if kind in ("regex", "grammar") and not isinstance(value, str):
        raise FieldError(field, f"{field}: must be a string")
    if kind == "choice" and (
        not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value)
    ):
        raise FieldError(field, f"{field}: must be a non-empty list of strings")
    return field, kind, value, options


def gbnf_choice(choices: list[str]) -> str:
    """A GBNF grammar whose language is exactly the given strings."""

    def lit(s: str) -> str:
        out = []
        for ch in s:
            if ch in '"\\':
                out.append("\\" + ch)
            elif ch == "\n":
                out.append("\\n")
            elif ch == "\r":
                out.append("\\r")
            elif ch == "\t":
                out.append("\\t")
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                out.append(f"\\x{ord(ch):02X}")
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'

    return "root ::= " + " | ".join(lit(c) for c in choices)


def regex_choice(choices: list[str]) -> str:
    """A regex matching exactly the given strings."""
    return "(" + "|".join("".join("\\" + c if c in _REGEX_META else c for c in s) for s in choices) + ")"


def _json_object(_: Any) -> dict[str, Any]:
    return {"type": "json_object"}


def _same(value: Any) -> Any:
    return value


# constraint kind -> (field, conversion) in each dialect that is not vLLM's; a kind missing is refused.
DIALECTS: dict[str, dict[str, tuple[str, Any]]] = {
    "sglang": {
        "json": ("json_schema", json.dumps),
        "regex": ("regex", _same),
        "choice": ("regex", regex_choice),
        "grammar": ("ebnf", _same),
        "json_object": ("response_format", _json_object),
    },
    "llama-server": {
        "json": ("json_schema", _same),
        "choice": ("grammar", gbnf_choice),
        "grammar": ("grammar", _same),
        "json_object": ("response_format", _json_object),
    },
}
HOSTED = {
    "json": (
        "response_format",
        lambda v: {
            "type": "json_schema",
            "json_schema": {"name": "constraint", "schema": v, "strict": False},
        },
    ),
    "json_object": ("response_format", _json_object),
}


def _strip(body: dict[str, Any]) -> dict[str, Any]:
    drop = set(GUIDED) | set(NATIVE) | set(OPTION_FIELDS) | {"structured_outputs", "guided_decoding_backend"}
    return {k: v for k, v in body.items() if k not in drop}


def translate(kind: str | None, route: str, body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the body for an upstream of this kind, notes on what was translated). Raises FieldError."""
    if kind == "tokenseam":
        return body, []
    out, notes = _constraints(kind, route, body)
    # Whether the ids really come back is checked on the answer (relay.py), for every kind.
    if body.get("return_token_ids") is True and kind == "llama-server":
        out = {**out, "return_tokens": True}
        notes = [*notes, "return_token_ids -> return_tokens"]
    return out, notes


def _constraints(kind: str | None, route: str, body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    found = _constraint(body)
    notes: list[str] = []
    backend = body.get("guided_decoding_backend")
    if found is None:
        if backend is None:
            return body, []
        out = _strip(body)
        return out, ["guided_decoding_backend removed (the upstream chooses its backend per server)"]
    field, ckind, value, options = found
    out = _strip(body)
    if backend is not None:
        notes.append("guided_decoding_backend removed (the upstream chooses its backend per server)")
    name = kind or "openai"
    chat = route.endswith("/chat/completions")

    def refuse(why: str) -> FieldError:
        return FieldError(
            field, f"{field}: {why}; the gateway refuses it rather than let the upstream drop it"
        )

    if kind == "vllm":
        out["structured_outputs"] = {ckind: value, **options}
        target = "structured_outputs" if field == "structured_outputs" else f"structured_outputs.{ckind}"
    else:
        if options:
            opt = "guided_whitespace_pattern" if "whitespace_pattern" in options else "structured_outputs"
            raise FieldError(
                opt,
                f"{opt}: {', '.join(sorted(options))} is a vLLM option; a {name} upstream has no such option",
            )
        table = DIALECTS.get(name)
        if table is None:
            if not chat:
                raise refuse(
                    f"a {name} upstream takes constraints only as response_format on chat completions"
                )
            table = HOSTED
        if ckind not in table:
            raise refuse(f"a {name} upstream has no {ckind} constraint")
        target, convert = table[ckind]
        out[target] = convert(value)
    if field != target:
        notes.append(f"{field} -> {target}")
    return out, notes
