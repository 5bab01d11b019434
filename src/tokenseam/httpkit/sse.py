"""Server-sent events as both apps write them: one encoder for an event, one streamed response type.

An event is `data: <compact JSON>` (or the literal `data: [DONE]`) and a blank line; UTF-8, no ASCII escaping.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Mapping
from typing import Any

from starlette.responses import StreamingResponse

# No caching, and no buffering by a proxy in front (nginx reads X-Accel-Buffering), so events arrive as sent.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(obj: Any) -> bytes:
    """One SSE event: `obj` as compact JSON, except the literal string `[DONE]` (the OpenAI stream's end)."""
    if obj == "[DONE]":
        return b"data: [DONE]\n\n"
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


def sse_response(events: AsyncIterable[bytes], headers: Mapping[str, str] | None = None) -> StreamingResponse:
    """A `text/event-stream` response over already encoded events, with `SSE_HEADERS` before `headers`."""
    return StreamingResponse(events, media_type="text/event-stream", headers={**SSE_HEADERS, **(headers or {})})
