"""A small HTTP/1.1 client for the gateway's non-streamed calls to plain-`http://` replicas.

httpx costs about 2 ms of Python per request on this path, more than everything else the gateway does; this
client sends one request on a pooled keep-alive connection and parses the answer with `httptools` (the
parser uvicorn uses), in a fraction of that. It does exactly what the gateway needs and no more: POST/GET
with a byte body, a response read whole (Content-Length or chunked), per-request timeouts, and a pool of
idle connections per host. Its failures are httpx's exception types (`ConnectError`, `ConnectTimeout`,
`ReadTimeout`, `RemoteProtocolError`), so the gateway maps and retries them in one place. Streams and
`https://` replicas use httpx.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import deque
from typing import Any

import httptools
import httpx

MAX_RESPONSE_BYTES = 256 * 1024 * 1024  # an upstream answer beyond this is a protocol error


class Response:
    """The part of `httpx.Response` the gateway reads."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: httpx.Headers, content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    def json(self) -> Any:
        return json.loads(self.content)


class _Conn(asyncio.Protocol):
    """One keep-alive connection: httptools parses what arrives; `exchange` awaits the complete answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.got_any = False
        self._reset()

    def _reset(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.size = 0
        self.keep_alive = False
        self.parser = httptools.HttpResponseParser(self)

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            if self.size > MAX_RESPONSE_BYTES:
                self._fail(
                    httpx.RemoteProtocolError("the upstream's answer is larger than the gateway accepts")
                )
            else:
                self._fail(httpx.RemoteProtocolError(f"malformed HTTP answer from the upstream: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            if not self.got_any:
                self.waiter.set_exception(_StaleConnection())
            else:
                self.waiter.set_exception(
                    httpx.RemoteProtocolError("the upstream closed the connection mid-answer")
                )

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        # httptools answers this reliably only while the headers are fresh.
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > MAX_RESPONSE_BYTES:
            raise ValueError("too large")  # httptools turns it into a parser error; data_received names it
        self.body.append(data)

    def on_message_complete(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def exchange(self, data: bytes, timeout: float) -> Response:
        assert self.transport is not None
        self._reset()
        self.got_any = False
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        self.transport.write(data)
        try:
            async with asyncio.timeout(timeout):
                await self.waiter
        except TimeoutError:
            self.close()
            raise httpx.ReadTimeout("the upstream did not answer within the timeout") from None
        finally:
            self.waiter = None
        headers = httpx.Headers([(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.headers])
        return Response(self.parser.get_status_code(), headers, b"".join(self.body))


class Http1Client:
    """Pooled keep-alive HTTP/1.1 connections to `http://host:port` targets."""

    def __init__(self, *, connect_timeout: float, read_timeout: float, max_idle: int = 64) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_idle = max_idle
        self._idle: dict[tuple[str, int], deque[_Conn]] = {}

    async def _connect(self, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(_Conn, host, port)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as e:
            # The errno's own words ("Connection refused"): the pool ejects a refusing replica at once.
            why = os.strerror(e.errno) if e.errno else str(e)
            raise httpx.ConnectError(f"[Errno {e.errno}] {why} ({host}:{port})") from None
        return conn

    async def request(
        self, method: str, host: str, port: int, target: str, headers: dict[str, str], body: bytes = b""
    ) -> Response:
        pool = self._idle.setdefault((host, port), deque())
        head = [f"{method} {target} HTTP/1.1", f"host: {host}:{port}", f"content-length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        while True:
            conn = None
            while pool and conn is None:
                c = pool.pop()
                conn = None if c.closed else c
            reused = conn is not None
            if conn is None:
                conn = await self._connect(host, port)
            try:
                r = await conn.exchange(data, self.read_timeout)
            except _StaleConnection:
                conn.close()
                if not reused:
                    raise httpx.RemoteProtocolError(
                        "the upstream closed the connection without answering"
                    ) from None
                continue  # a kept-alive connection the server had closed: nothing was processed, try a fresh one
            except BaseException:
                conn.close()
                raise
            if conn.keep_alive and not conn.closed and len(pool) < self.max_idle:
                pool.append(conn)
            else:
                conn.close()
            return r

    async def aclose(self) -> None:
        for pool in self._idle.values():
            while pool:
                pool.pop().close()


class _StaleConnection(Exception):
    """The connection was closed before any answer byte (a keep-alive the server had dropped)."""
