"""`Guard`: Host allow-list, CORS only as configured, bearer keys; and that it does not buffer streams."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import StreamingResponse
from starlette.routing import Route

from tokenseam.httpkit import Guard, default_allowed_hosts, host_only, normalize_host

KEY = "sk-client-0123456789"
OTHER_KEY = "sk-second-key"


@pytest.mark.parametrize(
    "bind,expected",
    [
        ("127.0.0.1", ["localhost", "127.0.0.1", "[::1]"]),
        ("127.0.0.2", ["localhost", "127.0.0.1", "[::1]", "127.0.0.2"]),
        ("::1", ["localhost", "127.0.0.1", "[::1]"]),
        ("[::1]", ["localhost", "127.0.0.1", "[::1]"]),
        ("localhost", ["localhost", "127.0.0.1", "[::1]"]),
        ("0.0.0.0", None),
        ("::", None),
        ("192.168.1.5", None),
        ("myhost.lan", None),
    ],
)
def test_default_allowed_hosts(bind, expected):
    assert default_allowed_hosts(bind) == expected


@pytest.mark.parametrize(
    "header,host",
    [
        ("127.0.0.1:8080", "127.0.0.1"),
        ("LocalHost", "localhost"),
        ("localhost.:80", "localhost"),
        ("[::1]:8080", "[::1]"),
        ("[::1]", "[::1]"),
        ("evil.example", "evil.example"),
        ("", ""),
        ("[::1", "[::1"),
    ],
)
def test_host_only(header, host):
    assert host_only(header) == host


def test_normalize_host():
    assert [normalize_host(h) for h in ("::1", "[::1]", "Example.COM:443", "*", "0:0::1")] == [
        "[::1]",
        "[::1]",
        "example.com",
        "*",
        "[::1]",
    ]


@pytest.mark.parametrize(
    "host,ok",
    [
        ("127.0.0.1", True),
        ("127.0.0.1:8080", True),
        ("localhost:8080", True),
        ("LOCALHOST", True),
        ("[::1]:8080", True),
        ("evil.example", False),
        ("evil.example:8080", False),
        ("127.0.0.1.evil.example", False),
        ("localhost.evil.example:80", False),
        ("[::2]:8080", False),
        ("[::1", False),
        ("", False),
    ],
)
def test_host_check_for_a_loopback_bind(make_client, host, ok):
    c = make_client(allowed_hosts=default_allowed_hosts("127.0.0.1"))
    r = c.get("/hello", headers={"host": host})
    if ok:
        assert r.status_code == 200 and r.json() == {"hello": "world"}
    else:
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["code"] == "invalid_host" and "DNS rebinding" in err["message"]
        # also for public paths: a rebinding page must not read /health either
        assert c.get("/health", headers={"host": host}).status_code == 400


def test_host_check_off_or_star_accepts_any_host(make_client):
    for c in (make_client(), make_client(allowed_hosts=["*", "localhost"]), make_client(allowed_hosts=[])):
        assert c.get("/hello", headers={"host": "evil.example"}).status_code == 200


async def _raw_request(app, headers):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/hello",
        "raw_path": b"/hello",
        "query_string": b"",
        "headers": headers,
        "http_version": "1.0",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1),
        "root_path": "",
        "asgi": {"version": "3.0"},
    }
    await app(scope, receive, send)
    return sent[0]["status"]


def test_a_request_without_a_host_header_is_rejected_when_hosts_are_checked():
    from .conftest import make_app

    assert asyncio.run(_raw_request(make_app(allowed_hosts=["localhost"]), [])) == 400
    assert asyncio.run(_raw_request(make_app(allowed_hosts=["localhost"]), [(b"host", b"localhost")])) == 200


def test_no_cors_headers_at_all_unless_configured(make_client):
    c = make_client()
    r = c.get("/hello", headers={"origin": "https://app.example"})
    assert r.status_code == 200 and not any(k.startswith("access-control-") for k in r.headers)
    pre = c.options(
        "/hello", headers={"origin": "https://app.example", "access-control-request-method": "GET"}
    )
    assert pre.status_code == 405 and not any(k.startswith("access-control-") for k in pre.headers)


def test_cors_preflight_allowed_and_denied(make_client):
    c = make_client(cors_origins=["https://app.example/"], api_keys=[KEY])
    pre = c.options(
        "/echo",
        headers={
            "origin": "https://app.example",
            "access-control-request-method": "POST",
            "access-control-request-headers": "Authorization, X-Stainless-OS",
        },
    )
    assert pre.status_code == 204  # no key needed: browsers never send one on a preflight
    assert pre.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in pre.headers["access-control-allow-methods"]
    allowed = [h.strip() for h in pre.headers["access-control-allow-headers"].split(",")]
    assert {"authorization", "content-type", "x-stainless-os"} <= set(allowed)
    assert "origin" in pre.headers["vary"].lower()
    denied = c.options(
        "/echo", headers={"origin": "https://evil.example", "access-control-request-method": "POST"}
    )
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in denied.headers


def test_cors_on_normal_responses_only_for_allowed_origins(make_client):
    c = make_client(cors_origins=["https://app.example"], api_keys=[KEY], expose_headers=["x-request-id"])
    auth = {"authorization": f"Bearer {KEY}"}
    ok = c.get("/hello", headers={"origin": "https://app.example", **auth})
    assert ok.headers["access-control-allow-origin"] == "https://app.example"
    assert ok.headers["access-control-expose-headers"] == "x-request-id"
    evil = c.get("/hello", headers={"origin": "https://evil.example", **auth})
    assert evil.status_code == 200 and "access-control-allow-origin" not in evil.headers
    # the allowed page can read why it was refused
    no_key = c.get("/hello", headers={"origin": "https://app.example"})
    assert (
        no_key.status_code == 401 and no_key.headers["access-control-allow-origin"] == "https://app.example"
    )


def test_cors_star_allows_any_origin(make_client):
    c = make_client(cors_origins=["*"])
    r = c.get("/hello", headers={"origin": "https://anything.example"})
    assert r.headers["access-control-allow-origin"] == "*"
    pre = c.options("/hello", headers={"origin": "null", "access-control-request-method": "GET"})
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize(
    "authorization,why",
    [
        (None, "requires an API key"),
        ("", "requires an API key"),
        ("Bearer", "no key after Bearer"),  # the scheme alone, no space
        ("Bearer ", "no key after Bearer"),
        ("Bearer    ", "no key after Bearer"),
        ("Bearer wrong", "invalid API key"),
        (f"Bearer {KEY[:-1]}", "invalid API key"),
        (f"Bearer {KEY}x", "invalid API key"),
        (f"Bearer {KEY},{OTHER_KEY}", "invalid API key"),
        ("Basic dXNlcjpzazEyMw==", "Bearer scheme"),
        (KEY, "Bearer scheme"),
        ("Bearer sk-ünïcode".encode(), "invalid API key"),
    ],
)
def test_wrong_or_missing_keys_are_401(make_client, authorization, why):
    c = make_client(api_keys=[KEY, OTHER_KEY, ""])
    headers = {} if authorization is None else {"authorization": authorization}
    r = c.get("/hello", headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    err = r.json()["error"]
    assert err["code"] == "invalid_api_key" and why in err["message"]
    assert KEY not in r.text and OTHER_KEY not in r.text and "wrong" not in r.text
    assert KEY not in str(r.headers)


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {KEY}", f"bearer {KEY}", f"BEARER  {KEY} ", f"Bearer {OTHER_KEY}", "Bearer clé-ünï".encode()],
)
def test_right_keys_pass(make_client, authorization):
    c = make_client(api_keys=[KEY, OTHER_KEY, "clé-ünï"])
    assert c.get("/hello", headers={"authorization": authorization}).json() == {"hello": "world"}


def test_public_paths_need_no_key_and_empty_key_lists_disable_auth(make_client):
    c = make_client(api_keys=[KEY])
    assert c.get("/health").status_code == 200
    assert c.get("/hello").status_code == 401
    assert c.post("/echo", json={"a": 1}).status_code == 401
    assert make_client(api_keys=[KEY], public_paths=()).get("/health").status_code == 401
    assert make_client(api_keys=["", ""]).get("/hello").status_code == 200


def test_streamed_responses_are_not_buffered():
    from tokenseam.httpkit import BackgroundServer

    first_read = threading.Event()

    async def stream(request):
        async def gen():
            yield b"first\n"
            # Released only once the client has the first chunk: a buffering middleware would hold it back.
            released = await asyncio.to_thread(first_read.wait, 10)
            yield b"released\n" if released else b"timed out\n"

        return StreamingResponse(gen(), media_type="text/plain")

    app = Starlette(
        routes=[Route("/stream", stream)],
        middleware=[
            Middleware(
                Guard, allowed_hosts=["127.0.0.1"], cors_origins=["https://app.example"], api_keys=[KEY]
            )
        ],
    )
    with BackgroundServer(app) as srv, httpx.Client(timeout=30) as c:
        with c.stream(
            "GET",
            srv.url + "/stream",
            headers={"authorization": f"Bearer {KEY}", "origin": "https://app.example"},
        ) as r:
            assert r.headers["access-control-allow-origin"] == "https://app.example"
            lines = r.iter_lines()
            assert next(lines) == "first"
            first_read.set()
            assert next(lines) == "released"
