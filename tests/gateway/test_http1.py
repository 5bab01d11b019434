"""The gateway's lean HTTP/1.1 client against raw servers that misbehave in every way it must survive."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tokenseam.gateway import http1
from tokenseam.gateway.http1 import Http1Client

OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"a": true}'


async def serve(handler):
    """A raw TCP server on a free port calling handler(reader, writer) per connection."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def run(coro):
    return asyncio.run(coro)


def client(**kw):
    return Http1Client(connect_timeout=kw.pop("connect_timeout", 2), read_timeout=kw.pop("read_timeout", 2))


async def _read_request(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    n = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head, await reader.readexactly(n)


def test_keep_alive_reuses_one_connection_and_sends_the_body():
    async def scenario():
        conns, bodies = [], []

        async def handler(reader, writer):
            conns.append(1)
            while True:
                try:
                    head, body = await _read_request(reader)
                except asyncio.IncompleteReadError:
                    return
                bodies.append((head.split(b"\r\n")[0], body))
                writer.write(OK)
                await writer.drain()

        server, port = await serve(handler)
        c = client()
        for i in range(5):
            r = await c.request(
                "POST", "127.0.0.1", port, f"/v1/x?q={i}", {"content-type": "application/json"}, b"{}"
            )
            assert (
                r.status_code == 200
                and r.json() == {"a": True}
                and r.headers["content-type"] == "application/json"
            )
        await c.aclose()
        server.close()
        return conns, bodies

    conns, bodies = run(scenario())
    assert len(conns) == 1 and bodies[3] == (b"POST /v1/x?q=3 HTTP/1.1", b"{}")


def test_chunked_answers_and_connection_close():
    chunked = b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{"a"\r\n5\r\n: 1}\n\r\n0\r\n\r\n'
    closing = b"HTTP/1.1 503 Busy\r\ncontent-length: 2\r\nconnection: close\r\n\r\nno"

    async def scenario():
        answers = [chunked, closing, OK]
        conns = []

        async def handler(reader, writer):
            conns.append(1)
            while answers:
                try:
                    await _read_request(reader)
                except asyncio.IncompleteReadError:
                    return
                a = answers.pop(0)
                writer.write(a)
                await writer.drain()
                if a is closing:
                    writer.close()
                    return

        server, port = await serve(handler)
        c = client()
        out = [await c.request("GET", "127.0.0.1", port, "/", {}) for _ in range(3)]
        server.close()
        return out, conns

    (a, b, c), conns = run(scenario())
    assert a.json() == {"a": 1} and (b.status_code, b.content) == (503, b"no") and c.status_code == 200
    assert len(conns) == 2  # `connection: close` was honoured: a new connection for the third


def test_a_kept_connection_the_server_dropped_is_replaced_silently():
    async def scenario():
        async def handler(reader, writer):
            await _read_request(reader)
            writer.write(OK)
            await writer.drain()
            writer.close()  # keep-alive promised, then dropped

        server, port = await serve(handler)
        c = client()
        first = await c.request("GET", "127.0.0.1", port, "/", {})
        await asyncio.sleep(0.05)
        second = await c.request("GET", "127.0.0.1", port, "/", {})
        server.close()
        return first, second

    a, b = run(scenario())
    assert a.status_code == b.status_code == 200


@pytest.mark.parametrize(
    "answer,error,needle",
    [
        (b'HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n{"half', httpx.RemoteProtocolError, "mid-answer"),
        (b"NOT HTTP AT ALL\r\n\r\n", httpx.RemoteProtocolError, "malformed"),
        (b"", httpx.RemoteProtocolError, "without answering"),
        (None, httpx.ReadTimeout, "timeout"),
    ],
)
def test_misbehaving_servers_raise_httpx_errors(answer, error, needle):
    async def scenario():
        async def handler(reader, writer):
            await _read_request(reader)
            if answer is None:
                await asyncio.sleep(5)
                return
            writer.write(answer)
            await writer.drain()
            writer.close()

        server, port = await serve(handler)
        c = client(read_timeout=0.3)
        try:
            with pytest.raises(error, match=needle):
                await c.request("POST", "127.0.0.1", port, "/", {}, b"x")
        finally:
            server.close()

    run(scenario())


def test_refused_and_oversized():
    from tests.respcache.conftest import free_port

    async def refused():
        with pytest.raises(httpx.ConnectError, match="refused"):
            await client().request("GET", "127.0.0.1", free_port(), "/", {})

    run(refused())

    async def huge(monkeypatch_limit):
        async def handler(reader, writer):
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n" + b"x" * 100000)
            await writer.drain()

        server, port = await serve(handler)
        try:
            with pytest.raises(httpx.RemoteProtocolError, match="larger"):
                await client().request("POST", "127.0.0.1", port, "/", {}, b"x")
        finally:
            server.close()

    old = http1.MAX_RESPONSE_BYTES
    http1.MAX_RESPONSE_BYTES = 1000
    try:
        run(huge(None))
    finally:
        http1.MAX_RESPONSE_BYTES = old
