"""BackgroundServer, the uvicorn thread tests and benchmarks serve apps from."""

from __future__ import annotations

import socket
import time

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tokenseam.httpkit import BackgroundServer


def _get(sock: socket.socket) -> bytes:
    sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n")
    data = b""
    while not data.endswith(b"ok"):
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    return data


def test_a_connection_idle_past_uvicorns_default_stays_open():
    # uvicorn closes an idle connection after 5 s by default; a client that sends on it just then gets
    # "connection reset". The server keeps it 75 s, as `tokenseam gateway` does.
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))])
    with BackgroundServer(app) as bg, socket.create_connection((bg.host, bg.port), timeout=10) as sock:
        assert _get(sock).startswith(b"HTTP/1.1 200")
        time.sleep(6)
        assert _get(sock).startswith(b"HTTP/1.1 200")  # the same connection, not closed meanwhile
