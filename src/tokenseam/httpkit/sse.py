"""The streamed response both apps send server-sent events in (the events themselves are `wire.sse`)."""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping

from starlette.responses import StreamingResponse

# No caching, and no buffering by a proxy in front (nginx reads X-Accel-Buffering), so events arrive as sent.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_response(events: AsyncIterable[bytes], headers: Mapping[str, str] | None = None) -> StreamingResponse:
    """A `text/event-stream` response over already encoded events, with `SSE_HEADERS` before `headers`."""
    return StreamingResponse(
        events, media_type="text/event-stream", headers={**SSE_HEADERS, **(headers or {})}
    )
