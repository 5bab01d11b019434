"""`CatchErrors`: an exception becomes a JSON 500 with a request id, the traceback is logged redacted, and the
keep-alive connection survives (Starlette's own `Exception` handler re-raises and uvicorn resets it)."""

from __future__ import annotations

import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tokenseam.httpkit import REQUEST_ID_HEADER, BackgroundServer, CatchErrors

SECRET = "s3cret-in-exception"
log = logging.getLogger("tests.httpkit.shield")


async def boom(request):
    raise RuntimeError(f"failed talking to http://u:{SECRET}@upstream")


async def ok(request):
    return JSONResponse({"ok": True})


async def broken_stream(request):
    async def gen():
        yield b"partial"
        raise RuntimeError(f"mid-stream {SECRET}")

    return StreamingResponse(gen(), media_type="text/plain")


def local_port(r: httpx.Response) -> int:
    return r.extensions["network_stream"].get_extra_info("client_addr")[1]


@pytest.fixture
def server():
    app = Starlette(
        routes=[Route("/boom", boom), Route("/ok", ok), Route("/broken", broken_stream)],
        middleware=[
            Middleware(CatchErrors, logger=log, redact=lambda t: t.replace(SECRET, "***"), what="test server")
        ],
    )
    with BackgroundServer(app) as srv:
        yield srv


def test_a_500_is_json_with_a_logged_request_id_and_the_connection_is_kept(server, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    with httpx.Client(timeout=20) as c:
        ports = []
        for path in ("/ok", "/boom", "/ok"):
            r = c.get(server.url + path)
            ports.append(local_port(r))
            if path == "/boom":
                failed = r
        after = r
    r = failed
    assert r.status_code == 500 and r.headers.get("connection") != "close"
    err = r.json()["error"]
    rid = r.headers[REQUEST_ID_HEADER]
    assert err["code"] == "internal_error" and err["type"] == "server_error" and rid in err["message"]
    assert SECRET not in r.text and "RuntimeError" not in r.text and "upstream" not in r.text
    assert after.status_code == 200 and ports[0] == ports[1] == ports[2]
    logged = [rec.getMessage() for rec in caplog.records if rec.name == log.name]
    assert (
        len(logged) == 1
        and rid in logged[0]
        and "RuntimeError" in logged[0]
        and "http://u:***@upstream" in logged[0]
    )
    assert SECRET not in caplog.text
    # nothing reached uvicorn's own error log (which would print the raw traceback)
    assert SECRET not in capfd.readouterr().err


def test_an_error_after_the_response_started_ends_that_response_only(server, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    with httpx.Client(timeout=20) as c:
        with pytest.raises(httpx.HTTPError):
            c.get(server.url + "/broken").read()
        assert c.get(server.url + "/ok").json() == {"ok": True}
    assert any("mid-stream ***" in rec.getMessage() for rec in caplog.records)
    assert SECRET not in caplog.text and SECRET not in capfd.readouterr().err
