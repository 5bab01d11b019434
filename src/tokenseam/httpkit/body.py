"""Reading a JSON request body strictly: media type, size, UTF-8, depth, surrogates, finite numbers, an object.

Everything here rejects with `HTTPError` (a 4xx) before the body reaches handlers, so hostile input never becomes a
500 further in (a RecursionError in a recursive walk, a UnicodeEncodeError when a lone surrogate is re-encoded).
"""

from __future__ import annotations

import json
import math
import operator
import re
from itertools import accumulate, repeat
from typing import Any

from starlette.requests import ClientDisconnect, Request

from .errors import HTTPError

DEFAULT_MAX_DEPTH = 128

# A JSON string (escapes included): removed before counting brackets, since brackets inside strings do not nest.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# Opening brackets become 2 and closing ones 0, so that "minus 1" gives +1/-1 and `accumulate` the running depth,
# all in C: a flat 8 MB array of arrays is scanned without a Python-level loop per bracket.
_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
# A \uD800-\uDFFF escape; a false positive (an escaped backslash before "ud800") only costs the exact walk below.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class _NotJSON(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJSON(f"{name} is not a JSON value (JSON has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    f = float(text)
    if math.isinf(f):
        # Python would re-serialize it as `Infinity`, which is not JSON either: the upstream would reject it.
        raise _NotJSON(f"the number {text[:40]} is too large for a double")
    return f


def check_content_type(value: str | None) -> None:
    """Accept `application/json` (any case, optional `charset=utf-8`); anything else is a 415.

    Browsers send `text/plain`, form and multipart bodies cross-origin without a CORS preflight, so accepting
    them would let any web page post to a local server; JSON is UTF-8 only (RFC 8259)."""
    if not value or not value.strip():
        raise HTTPError(
            415,
            "the request has no Content-Type; send Content-Type: application/json",
            "unsupported_media_type",
        )
    media, _, params = value.partition(";")
    if media.strip().lower() != "application/json":
        hint = (
            " (curl -d sends this type: add -H 'Content-Type: application/json')"
            if media.strip().lower() == "application/x-www-form-urlencoded"
            else ""
        )
        raise HTTPError(
            415,
            f"Content-Type {media.strip()[:100]!r} is not supported; send application/json{hint}",
            "unsupported_media_type",
        )
    for param in params.split(";"):
        name, _, val = param.partition("=")
        charset = val.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            raise HTTPError(
                415,
                f"charset {charset[:40]!r} is not supported; JSON bodies must be UTF-8",
                "unsupported_media_type",
            )


def json_depth(text: str) -> int:
    """Deepest nesting of arrays/objects in JSON `text`, without recursing (exact for valid JSON)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    return max(accumulate(map(operator.sub, brackets.encode("ascii").translate(_STEP), repeat(1))))


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def find_surrogate(value: Any) -> tuple[str, bool] | None:
    """(path, is_a_key) of the first string holding a lone UTF-16 surrogate, or None.

    Paths look like `messages[0].content`; keys on a returned path are surrogate-free, so the path can be encoded."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return path, False
        elif isinstance(v, dict):
            for k in v:
                if _SURROGATE.search(k):
                    return path, True
            stack.extend((x, f"{path}.{k}" if path else k) for k, x in reversed(v.items()))
        elif isinstance(v, list):
            stack.extend((x, f"{path}[{i}]") for i, x in reversed(list(enumerate(v))))
    return None


def parse_json_object(raw: bytes, *, max_depth: int = DEFAULT_MAX_DEPTH) -> dict[str, Any]:
    """Parse a request body that must be one JSON object; duplicate keys keep the last value, as `json` does."""
    if not raw.strip():
        raise HTTPError(400, "the request body is empty; send a JSON object", "invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HTTPError(
            400, f"the request body is not valid UTF-8 (byte {e.start}: {e.reason})", "invalid_json"
        ) from None
    # The bracket count bounds the depth, so ordinary bodies skip the scan.
    if text.count("[") + text.count("{") > max_depth and json_depth(text) > max_depth:
        raise HTTPError(400, f"the request body is nested more than {max_depth} levels deep", "invalid_json")
    try:
        body = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise HTTPError(400, "the request body is nested too deeply", "invalid_json") from None
    except ValueError as e:  # JSONDecodeError, _NotJSON, and int() beyond sys.get_int_max_str_digits()
        raise HTTPError(400, f"the request body is not valid JSON: {e}", "invalid_json") from None
    if not isinstance(body, dict):
        raise HTTPError(400, f"the request body must be a JSON object, not {_kind(body)}", "invalid_request")
    if _SURROGATE_ESCAPE.search(text):
        found = find_surrogate(body)
        if found is not None:
            path, is_key = found
            where = (
                (f"a field name in {path[:200]}" if path else "a top-level field name")
                if is_key
                else (path[:200] or "the body")
            )
            raise HTTPError(
                400,
                f"the request body has a lone UTF-16 surrogate escape (\\ud800-\\udfff without "
                f"its pair) in {where}; JSON strings must be valid Unicode",
                "invalid_json",
                param=path[:200] or None,
            )
    return body


async def read_body_bytes(request: Request, max_bytes: int) -> bytes:
    """The raw body, refused with a 413 as soon as it exceeds `max_bytes` (declared or streamed)."""
    cl = request.headers.get("content-length")
    if cl is not None and cl.isdigit() and int(cl) > max_bytes:
        raise HTTPError(413, f"request body is {cl} bytes; the limit is {max_bytes}", "request_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise HTTPError(
                    413, f"request body exceeds the limit of {max_bytes} bytes", "request_too_large"
                )
            chunks.append(chunk)
    except ClientDisconnect:
        raise HTTPError(
            400, "the client disconnected before sending the whole body", "client_closed"
        ) from None
    return b"".join(chunks)


async def read_json_body(
    request: Request, max_bytes: int, *, max_depth: int = DEFAULT_MAX_DEPTH
) -> dict[str, Any]:
    """Content-Type check (415), size limit (413), then `parse_json_object` (400s)."""
    check_content_type(request.headers.get("content-type"))
    return parse_json_object(await read_body_bytes(request, max_bytes), max_depth=max_depth)
