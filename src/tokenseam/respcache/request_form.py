"""The normalized request form and the one fingerprint every response-cache read and write uses.

The normalized request is also the request that gets generated (locally or upstream), so a hit returns what a
miss computes.

Rules (documented in docs/response-cache.md):
- Fields are sorted into three kinds. Transport and bookkeeping fields (`stream`, `stream_options`, `user`,
  `metadata`, request ids, `cache_prompt`, ...) are removed. Known answer-changing fields are normalised.
  Unknown fields are kept as they are, in the key and in the generated request: an unknown field can only
  split the cache, never merge two different answers.
- Defaults come from the table the server's parser also reads (`wire.DEFAULTS`). A `FILL` default is always
  written into the normalized request; a `DROP` default is removed when the value equals it. `null` means
  "default".
- Every key whose name starts with `_` is removed at every depth (JSON Schema property *names* are data,
  not fields, and are kept).
- Numbers are normalized: an integral float becomes an int (`1.0` == `1`); NaN and infinities are errors.
- `tools` (and legacy `functions`) are sorted by function name; `stop` strings sorted and de-duplicated.
- Chat message text is NFC-normalised, CRLF -> LF, trailing whitespace trimmed; a raw completion
  `prompt` is NFC-normalised only (its end is the boundary token healing works on).
- Serialisation for the hash (`fingerprint_text`): keys sorted recursively, no whitespace, except JSON Schema
  `properties` maps, whose order is part of the meaning (constrained decoders emit properties in schema order).
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from collections.abc import Mapping
from json.encoder import encode_basestring
from typing import Any

from ..wire import DEFAULTS, DROP, FILL, ROUTE_CHAT, ROUTE_LLAMA, ROUTES, field_default
from .errors import CacheRequestError

FINGERPRINT_VERSION = "tokenseam-fp/1"


class OrderedMap(dict):
    """A JSON object whose key order is part of its meaning (a JSON Schema `properties` map)."""


# Fields that never change the generated answer: removed from the key and from the generated request.
# `stream` and `stream_options` are transport: the cache layer adds them back when it forwards a stream.
EXCLUDED_FIELDS = frozenset(
    {
        "stream",
        "stream_options",
        "user",
        "metadata",
        "store",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "request_id",
        "requestId",
        "x_request_id",
        "x-request-id",
        "id",
        "cache_prompt",
        "id_slot",
        "timings_per_token",
        "return_progress",
    }
)

# Keys whose value is a JSON Schema, per route (nested paths are handled where they occur).
_SCHEMA_FIELDS = ("guided_json", "json_schema")
# Schema keywords whose value maps names (data, kept even when `_`-prefixed) to sub-schemas.
_SCHEMA_NAME_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_SUB = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "additionalItems",
)
_SCHEMA_SUB_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")


def _number(v: float, path: str) -> int | float:
    if math.isnan(v) or math.isinf(v):
        raise CacheRequestError(f"{path}: NaN and infinite numbers are not valid JSON", param=path)
    if v.is_integer() and abs(v) < 2**63:
        return int(v)
    return v


def _clean(value: Any, path: str) -> Any:
    """Generic pass: drop `_` keys at every depth, normalize numbers."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return _number(value, path)
    if isinstance(value, Mapping):
        return {
            k: _clean(v, f"{path}.{k}")
            for k, v in value.items()
            if not (isinstance(k, str) and k.startswith("_"))
        }
    if isinstance(value, list | tuple):
        return [_clean(v, f"{path}[{i}]") for i, v in enumerate(value)]
    raise CacheRequestError(f"{path}: unsupported value of type {type(value).__name__}", param=path)


def normalize_schema(schema: Any, path: str = "schema") -> Any:
    """A JSON Schema normalized: `_` keywords removed, numbers normalized, `properties` order kept as meaning."""
    if not isinstance(schema, Mapping):
        return _clean(schema, path)
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if not isinstance(k, str) or k.startswith("_"):
            continue
        if k in _SCHEMA_NAME_MAPS and isinstance(v, Mapping):
            m = OrderedMap() if k == "properties" else {}
            for name, sub in v.items():
                m[name] = normalize_schema(sub, f"{path}.{k}.{name}")
            out[k] = m
        elif k in _SCHEMA_SUB and isinstance(v, Mapping):
            out[k] = normalize_schema(v, f"{path}.{k}")
        elif k in _SCHEMA_SUB_LISTS and isinstance(v, list):
            out[k] = [normalize_schema(s, f"{path}.{k}[{i}]") for i, s in enumerate(v)]
        elif k == "items" and isinstance(v, list):
            out[k] = [normalize_schema(s, f"{path}.{k}[{i}]") for i, s in enumerate(v)]
        else:
            out[k] = _clean(v, f"{path}.{k}")
    return out


def _chat_text(s: str) -> str:
    if not s.isascii():
        s = unicodedata.normalize("NFC", s)
    if "\r\n" in s:
        s = s.replace("\r\n", "\n")
    return s.rstrip()


def _nfc(s: str) -> str:
    return s if s.isascii() else unicodedata.normalize("NFC", s)


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise CacheRequestError("messages: must be a non-empty array of message objects", param="messages")
    out = []
    for i, m in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise CacheRequestError(f"{p}: must be an object with a role and content", param=p)
        if not isinstance(m.get("role"), str):
            raise CacheRequestError(f"{p}.role: must be a string", param=f"{p}.role")
        msg = _clean(m, p)
        content = msg.get("content")
        if isinstance(content, str):
            msg["content"] = _chat_text(content)
        elif isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    part = dict(part, text=_chat_text(part["text"]))
                elif not isinstance(part, dict):
                    raise CacheRequestError(
                        f"{p}.content[{j}]: must be a content-part object", param=f"{p}.content[{j}]"
                    )
                parts.append(part)
            msg["content"] = parts
        elif content is not None:
            raise CacheRequestError(
                f"{p}.content: must be a string, an array of parts or null", param=f"{p}.content"
            )
        if isinstance(msg.get("reasoning_content"), str):
            msg["reasoning_content"] = _chat_text(msg["reasoning_content"])
        out.append(msg)
    return out


def _prompt(prompt: Any) -> Any:
    if isinstance(prompt, str):
        return _nfc(prompt)
    if isinstance(prompt, list):
        if prompt and set(map(type, prompt)) == {int}:
            return list(prompt)  # token ids: as they are (a long prompt is checked in one pass in C)
        out = []
        for i, p in enumerate(prompt):
            if isinstance(p, str):
                out.append(_nfc(p))
            elif isinstance(p, bool) or p is None:
                raise CacheRequestError(
                    f"prompt[{i}]: must be a string, a token id or an array", param="prompt"
                )
            elif isinstance(p, int | float):
                out.append(_number(float(p), f"prompt[{i}]") if isinstance(p, float) else p)
            elif isinstance(p, list):
                out.append(_prompt(p))
            elif isinstance(p, Mapping):
                out.append(_clean(p, f"prompt[{i}]"))  # llama-server multimodal prompt objects
            else:
                raise CacheRequestError(f"prompt[{i}]: unsupported value", param="prompt")
        return out
    raise CacheRequestError("prompt: must be a string or an array of strings / token ids", param="prompt")


def _stop(stop: Any) -> list[str]:
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return sorted(set(stop))
    raise CacheRequestError("stop: must be a string or an array of strings", param="stop")


def _tool_name(tool: Any) -> tuple[str, str]:
    if isinstance(tool, Mapping):
        fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        name = fn.get("name")
        return (str(tool.get("type", "function")), name if isinstance(name, str) else "")
    return ("", "")


def _tools(tools: Any, field: str) -> list[Any]:
    if not isinstance(tools, list):
        raise CacheRequestError(f"{field}: must be an array of tool objects", param=field)
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, Mapping):
            raise CacheRequestError(f"{field}[{i}]: must be an object", param=f"{field}[{i}]")
        t = _clean(t, f"{field}[{i}]")
        fn = t.get("function")
        if isinstance(fn, dict) and "parameters" in fn:
            t["function"] = dict(
                fn, parameters=normalize_schema(fn["parameters"], f"{field}[{i}].parameters")
            )
        elif "parameters" in t:
            t["parameters"] = normalize_schema(t["parameters"], f"{field}[{i}].parameters")
        out.append(t)
    # Stable sort: tools of the same name keep their order (a duplicate name is the upstream's error to report).
    out.sort(key=_tool_name)
    return out


def _response_format(rf: Any) -> Any:
    if not isinstance(rf, Mapping):
        raise CacheRequestError(
            'response_format: must be an object such as {"type": "json_schema", ...}', param="response_format"
        )
    out = _clean({k: v for k, v in rf.items() if k not in ("json_schema", "schema")}, "response_format")
    if isinstance(rf.get("json_schema"), Mapping):
        js = _clean(
            {k: v for k, v in rf["json_schema"].items() if k != "schema"}, "response_format.json_schema"
        )
        if "schema" in rf["json_schema"]:
            js["schema"] = normalize_schema(rf["json_schema"]["schema"], "response_format.json_schema.schema")
        out["json_schema"] = js
    elif "json_schema" in rf:
        out["json_schema"] = _clean(rf["json_schema"], "response_format.json_schema")
    if "schema" in rf:
        out["schema"] = normalize_schema(rf["schema"], "response_format.schema")
    return out


def _logit_bias(lb: Any, route: str) -> Any:
    if isinstance(lb, Mapping):
        out = {}
        for k, v in lb.items():
            key = str(k)
            if route != ROUTE_LLAMA:
                try:
                    key = str(int(key))
                except ValueError:
                    raise CacheRequestError(
                        f"logit_bias: key {k!r} is not a token id", param="logit_bias"
                    ) from None
            out[key] = _clean(v, f"logit_bias.{k}")
        return out
    return _clean(lb, "logit_bias")


def _is_default(value: Any, equivalents: Any) -> bool:
    candidates = equivalents if isinstance(equivalents, tuple) else (equivalents,)
    for d in candidates:
        if type(value) is bool or type(d) is bool:
            if type(value) is type(d) and value == d:
                return True
        elif value == d:
            return True
    return False


def normalize_request(route: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The normalized form of a generation request for `route`; idempotent. Raises `CacheRequestError`."""
    try:
        return _normalize(route, body)
    except RecursionError:
        raise CacheRequestError("the request body is nested too deeply to canonicalize") from None


def _normalize(route: str, body: Mapping[str, Any]) -> dict[str, Any]:
    if route not in DEFAULTS:
        raise CacheRequestError(f"route {route!r} is not cacheable; expected one of {', '.join(ROUTES)}")
    if not isinstance(body, Mapping):
        raise CacheRequestError("request body must be a JSON object")
    out: dict[str, Any] = {}
    for key, value in body.items():
        if not isinstance(key, str) or key.startswith("_") or key in EXCLUDED_FIELDS or value is None:
            continue
        if key == "messages" and route == ROUTE_CHAT:
            value = _messages(value)
        elif key == "prompt" and route != ROUTE_CHAT:
            value = _prompt(value)
        elif key == "stop":
            value = _stop(value)
        elif key in ("tools", "functions"):
            value = _tools(value, key)
        elif key == "response_format":
            value = _response_format(value)
        elif key == "logit_bias":
            value = _logit_bias(value, route)
        elif key in _SCHEMA_FIELDS and isinstance(value, Mapping):
            value = normalize_schema(value, key)
        elif key == "structured_outputs" and isinstance(value, Mapping):
            value = {
                k: (
                    normalize_schema(v, f"{key}.{k}")
                    if k == "json" and isinstance(v, Mapping)
                    else _clean(v, f"{key}.{k}")
                )
                for k, v in value.items()
                if not k.startswith("_")
            }
        elif key == "model" and not isinstance(value, str):
            raise CacheRequestError("model: must be a string", param="model")
        else:
            value = _clean(value, key)
        out[key] = value
    if route == ROUTE_CHAT and "messages" not in out:
        raise CacheRequestError("messages: required for /v1/chat/completions", param="messages")
    if route != ROUTE_CHAT and "prompt" not in out:
        raise CacheRequestError(f"prompt: required for {route}", param="prompt")
    for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p"):
        if key in out and (isinstance(out[key], bool) or not isinstance(out[key], int | float)):
            raise CacheRequestError(f"{key}: must be a number", param=key)
    for key in ("n", "max_tokens", "max_completion_tokens", "n_predict", "top_k", "seed", "top_logprobs"):
        if key in out and (isinstance(out[key], bool) or not isinstance(out[key], int)):
            raise CacheRequestError(f"{key}: must be an integer", param=key)
    # Chat without tools: tool_choice "none" is the default; with tools, "auto" is.
    if route == ROUTE_CHAT:
        tc = out.get("tool_choice")
        if tc == ("auto" if out.get("tools") or out.get("functions") else "none"):
            del out["tool_choice"]
    for key, (mode, value) in DEFAULTS[route].items():
        if key in out:
            if mode == DROP and _is_default(out[key], value):
                del out[key]
        elif mode == FILL:
            out[key] = value
    if route == ROUTE_CHAT and not out.get("logprobs"):
        out.pop("top_logprobs", None)  # meaningless without logprobs
    return out


def is_deterministic(route: str, normalized: Mapping[str, Any]) -> bool:
    """Whether the normalized request asks for a reproducible answer: temperature 0 or an explicit seed."""
    temp = normalized.get("temperature", field_default(route, "temperature"))
    if route == ROUTE_LLAMA:
        return temp <= 0 or "seed" in normalized
    return temp == 0 or "seed" in normalized


def fingerprint_text(value: Any) -> str:
    """The unambiguous serialisation that gets hashed: JSON structure, no whitespace, keys sorted recursively
    (an `OrderedMap` keeps its order), normalized numbers; strings of 32+ characters are written as
    `'<length>:<raw text>` instead of escaped JSON (same meaning, no escaping cost on long prompts)."""
    parts: list[str] = []
    _emit(value, parts)
    return "".join(parts)


def _str(s: str) -> str:
    # A JSON string starts with '"', a framed one with "'": the two forms can never be confused.
    if len(s) >= 32:
        return f"'{len(s)}:{s}"
    return encode_basestring(s)


def _emit(v: Any, out: list[str]) -> None:
    if isinstance(v, str):
        out.append(_str(v))
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif v is None:
        out.append("null")
    elif isinstance(v, int):
        out.append(str(int(v)))
    elif isinstance(v, float):
        out.append(repr(_number(v, "number")))
    elif isinstance(v, OrderedMap):
        # An ordered map must never equal a sorted one that happens to list the same pairs: mark it.
        out.append('{"#ordered":[')
        for i, (k, x) in enumerate(v.items()):
            if i:
                out.append(",")
            out.append("[" + _str(str(k)) + ",")
            _emit(x, out)
            out.append("]")
        out.append("]}")
    elif isinstance(v, Mapping):
        out.append("{")
        for i, k in enumerate(sorted(v, key=str)):
            if i:
                out.append(",")
            out.append(_str(str(k)) + ":")
            _emit(v[k], out)
        out.append("}")
    elif isinstance(v, list | tuple):
        if len(v) > 8 and type(v) in (list, tuple) and set(map(type, v)) == {int}:
            # Token ids, the longest part of most bodies: the text the loop below writes, made in C (an int's
            # repr is its str, and holds no space; a subclass of list or tuple may write its own repr).
            out.append("[" + repr(v)[1:-1].replace(" ", "") + "]")
            return
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(",")
            _emit(x, out)
        out.append("]")
    else:
        raise CacheRequestError(f"cannot fingerprint a value of type {type(v).__name__}")


def fingerprint_normalized(
    route: str, normalized: Mapping[str, Any], tenant: str = "", namespace: str = ""
) -> str:
    """SHA-256 hex of an already normalized request (what `fingerprint_request` hashes)."""
    try:
        body = fingerprint_text(normalized)
    except RecursionError:
        raise CacheRequestError("the request body is nested too deeply to fingerprint") from None
    text = "\n".join((FINGERPRINT_VERSION, namespace, tenant, route, body))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def fingerprint_request(route: str, body: Mapping[str, Any], tenant: str = "", namespace: str = "") -> str:
    """The cache key of a request: SHA-256 over its normalized form, scoped by tenant and namespace."""
    return fingerprint_normalized(route, normalize_request(route, body), tenant=tenant, namespace=namespace)


def tenant_from_api_key(api_key: str | None) -> str:
    """A tenant id from an API key (or an `Authorization: Bearer ...` header): a short hash, never the key."""
    if not api_key:
        return ""
    key = api_key.strip()
    if key.lower().startswith("bearer "):
        key = key[7:].strip()
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
