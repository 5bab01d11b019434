"""Engine events on their way to a request: `EventRelay` (engine thread -> event loop) and `request_events`
(one request's batches, cancelling it in the engine when its client leaves).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator

from starlette.requests import Request

from ..engine import Engine, RequestDone
from ..engine.sequence import RequestState


class EventRelay:
    """Hands engine events (engine thread) to request queues (event loop): one loop wake-up carries all the
    events that arrive before the loop runs, instead of one per request per step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[asyncio.AbstractEventLoop, list] = {}

    def send(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, events: list) -> None:
        with self._lock:
            batch = self._pending.setdefault(loop, [])
            batch.append((queue, events))
            if len(batch) > 1:
                return  # a wake-up is already on its way
        try:
            loop.call_soon_threadsafe(self._flush, loop)
        except RuntimeError:  # the event loop is gone (shutdown); the engine must not die for it
            with self._lock:
                self._pending.pop(loop, None)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            batch = self._pending.pop(loop, [])
        for queue, events in batch:
            queue.put_nowait(events)


log = logging.getLogger("tokenseam.server")

_GONE: list = []  # put on a request's queue when its client disconnects (compared by identity)


async def _watch_disconnect(request: Request, queue: asyncio.Queue) -> None:
    """Wait for the client to leave (the body is read, so the next ASGI message is the disconnect) and wake the
    request's event loop at once, not at its next timer."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            queue.put_nowait(_GONE)
            return


async def request_events(
    request: Request, engine: Engine, handle: RequestState, queue: asyncio.Queue, watch: bool = False
) -> AsyncIterator[list]:
    """Engine events for one request, drained in batches; cancels the request if the client goes away.

    `watch`: listen for the disconnect (non-streamed responses, where nothing is written that would fail).
    A streamed response learns it from its writes and from Starlette, which cancels the stream; the timer
    below also covers a request still waiting in the engine's queue."""
    done = False
    watcher = asyncio.create_task(_watch_disconnect(request, queue)) if watch else None
    try:
        while True:
            if queue.empty():
                try:
                    async with asyncio.timeout(0.5):  # a timer, not a task per event as wait_for would be
                        evs = await queue.get()
                except TimeoutError:
                    if watcher is None and await request.is_disconnected():
                        return
                    continue
            else:
                evs = queue.get_nowait()
            if evs is _GONE:
                return
            while not queue.empty():  # everything the engine produced meanwhile goes out in one write
                more = queue.get_nowait()
                if more is _GONE:
                    return
                evs = evs + more
            yield evs
            if any(isinstance(e, RequestDone) for e in evs):
                done = True
                return
    finally:
        if watcher is not None:
            watcher.cancel()
        if not done:
            engine.cancel(handle)
            log.info("request %d: the client closed the connection; its generation is cancelled", handle.id)
