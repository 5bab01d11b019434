"""Gateway hardening: credentials never leave it, hostile bodies never reach the upstream, client keys, Host/CORS,
and a 500 that neither leaks exception text nor drops the keep-alive connection."""

from __future__ import annotations

import base64
import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tokenseam.httpkit import BackgroundServer

from .conftest import free_port

pytestmark = pytest.mark.server

SECRET = "s3cret"
UP_KEY = "sk-upstream-Zq81x"
CLIENT_KEY = "ck-client-1"
MSG = [{"role": "user", "content": "Name a river."}]
CHAT = "/v1/chat/completions"


def secret_url(port: int) -> str:
    return f"http://user:{SECRET}@127.0.0.1:{port}/v1?api_key={SECRET}"


def auth(key: str = CLIENT_KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def assert_clean(text: str) -> None:
    assert SECRET not in text and UP_KEY not in text


@pytest.fixture
def echo_upstream():
    """An upstream that records what it was sent and answers 401 quoting the Authorization it got."""
    seen: list[dict] = []

    async def record(request: Request):
        seen.append(
            {
                "path": request.url.path,
                "query": request.url.query,
                "authorization": request.headers.get("authorization"),
            }
        )
        if request.url.path == "/v1/models":
            return JSONResponse({"object": "list", "data": []})
        return JSONResponse(
            {
                "error": {
                    "message": f"Incorrect API key provided: {request.headers.get('authorization')}",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            },
            status_code=401,
        )

    app = Starlette(
        routes=[
            Route("/v1/models", record),
            Route(CHAT, record, methods=["POST"]),
            Route("/v1/refuse", record),
        ]
    )
    with BackgroundServer(app) as srv:
        srv.seen = seen
        yield srv


def test_unreachable_upstream_502_and_health_show_no_credentials(make_gateway, caplog):
    caplog.set_level(logging.DEBUG)
    port = free_port()
    gw = make_gateway(secret_url(port), api_key=UP_KEY, client_api_keys=[CLIENT_KEY])
    shown = f"http://user:***@127.0.0.1:{port}?api_key=***"
    with httpx.Client(timeout=20) as h:
        for stream in (False, True):
            r = h.post(
                gw.url + CHAT, json={"messages": MSG, "temperature": 0, "stream": stream}, headers=auth()
            )
            assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unreachable"
            assert shown in r.json()["error"]["message"]
            assert_clean(r.text)
        models = h.get(gw.url + "/v1/models", headers=auth())
        assert models.status_code == 502
        assert_clean(models.text)
        health = h.get(gw.url + "/health")  # public: no key
    # The refused connection took the only replica out of rotation: the gateway cannot serve, and says so.
    assert health.status_code == 503 and health.json()["upstream"] == shown
    assert health.json()["status"] == "unavailable" and health.json()["replicas"][0]["healthy"] is False
    assert_clean(health.text)
    assert_clean(caplog.text)


def test_transport_errors_quoting_the_url_or_key_are_redacted(make_gateway, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    url = secret_url(free_port())

    async def failing(self, target, *a, **kw):
        raise httpx.ConnectError(f"could not connect to {url} (headers {kw.get('headers')}) for {target}")

    async def failing_http1(self, method, host, port, target, headers, body=b""):
        raise httpx.ConnectError(f"could not connect to {url} (headers {headers}) for {target}")

    from tokenseam.gateway.http1 import Http1Client

    # Both HTTP clients the gateway uses (httpx for streams and https, the lean one for plain http).
    monkeypatch.setattr(httpx.AsyncClient, "post", failing)
    monkeypatch.setattr(httpx.AsyncClient, "get", failing)
    monkeypatch.setattr(Http1Client, "request", failing_http1)
    gw = make_gateway(url, api_key=UP_KEY, client_api_keys=[CLIENT_KEY])
    with httpx.Client(timeout=20) as h:
        r = h.post(gw.url + CHAT, json={"messages": MSG, "temperature": 0}, headers=auth())
        m = h.get(gw.url + "/v1/models", headers=auth())
    for resp in (r, m):
        err = resp.json()["error"]
        assert resp.status_code == 502 and "could not connect to http://user:***@" in err["message"]
        assert_clean(resp.text)
    assert_clean(caplog.text)


def test_the_url_query_is_forwarded_and_upstream_bodies_quoting_the_key_are_scrubbed(
    echo_upstream, make_gateway, fake, caplog
):
    caplog.set_level(logging.DEBUG)  # httpx logs each request's URL at INFO
    gw = make_gateway(
        echo_upstream.url + f"/v1?api_key={SECRET}&api-version=2024",
        api_key=UP_KEY,
        client_api_keys=[CLIENT_KEY],
    )
    with httpx.Client(timeout=20) as h:
        assert h.get(gw.url + "/v1/models", headers=auth()).status_code == 200
        r = h.post(gw.url + CHAT, json={"messages": MSG, "temperature": 0}, headers=auth())
    # The client's model list, the gateway's own look at what the upstream is (before the first generation),
    # then the generation: each with the query and the upstream key.
    assert [(s["path"], s["query"]) for s in echo_upstream.seen] == [
        ("/v1/models", f"api_key={SECRET}&api-version=2024"),
        ("/v1/models", f"api_key={SECRET}&api-version=2024"),
        (CHAT, f"api_key={SECRET}&api-version=2024"),
    ]
    assert {s["authorization"] for s in echo_upstream.seen} == {f"Bearer {UP_KEY}"}
    assert r.status_code == 401 and r.json()["error"]["message"] == "Incorrect API key provided: Bearer ***"
    assert_clean(r.text)
    # the query does not break generation against a real upstream either
    ok = make_gateway(fake.url + f"/v1?api_key={SECRET}")
    with httpx.Client(timeout=20) as h:
        assert h.post(ok.url + CHAT, json={"messages": MSG, "temperature": 0}).status_code == 200
        # a password in the URL is sent as Basic auth, never in a URL httpx could log; an upstream key wins over it
        userinfo = make_gateway(f"http://user:{SECRET}@127.0.0.1:{echo_upstream.port}/v1")
        assert h.get(userinfo.url + "/v1/models").status_code == 200
        keyed = make_gateway(
            f"http://user:{SECRET}@127.0.0.1:{echo_upstream.port}/v1",
            api_key=UP_KEY,
            client_api_keys=[CLIENT_KEY],
        )
        assert h.get(keyed.url + "/v1/models", headers=auth()).status_code == 200
    basic = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
    assert [s["authorization"] for s in echo_upstream.seen[-2:]] == [basic, f"Bearer {UP_KEY}"]
    assert "api_key=***" in caplog.text
    assert_clean(caplog.text)


def test_client_keys_are_required_and_never_forwarded(echo_upstream, fake, make_gateway):
    gw = make_gateway(fake.url, client_api_keys=[CLIENT_KEY, "ck-client-2"])
    body = {"model": "fake-model", "messages": MSG, "temperature": 0}
    with httpx.Client(timeout=20) as h:
        for headers in (
            {},
            auth("wrong"),
            {"authorization": "Bearer"},
            {"authorization": f"Basic {CLIENT_KEY}"},
        ):
            r = h.post(gw.url + CHAT, json=body, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["code"] == "invalid_api_key" and CLIENT_KEY not in r.text
        assert fake.state.calls == 0
        assert h.get(gw.url + "/metrics").status_code == 401
        assert h.get(gw.url + "/health").status_code == 200
        assert h.post(gw.url + CHAT, json=body, headers=auth()).status_code == 200
        assert h.post(gw.url + CHAT, json=body, headers=auth("ck-client-2")).status_code == 200
        # the client's header holds a gateway key: it is not sent upstream (the upstream key is, when set)
        plain = make_gateway(echo_upstream.url, client_api_keys=[CLIENT_KEY])
        keyed = make_gateway(echo_upstream.url, client_api_keys=[CLIENT_KEY], api_key=UP_KEY)
        h.get(plain.url + "/v1/models", headers=auth())
        h.get(keyed.url + "/v1/models", headers=auth())
    assert [s["authorization"] for s in echo_upstream.seen] == [None, f"Bearer {UP_KEY}"]


@pytest.mark.parametrize(
    "raw,content_type,status,param",
    [
        (
            '{"messages": [{"role": "user", "content": "\\ud800"}], "temperature": 0}',
            "application/json",
            400,
            "messages[0].content",
        ),
        (
            '{"messages": [{"role": "user", "content": "x"}], "temperature": 0, "stop": ["\\udfff"]}',
            "application/json",
            400,
            "stop[0]",
        ),
        (
            '{"messages": [{"role": "user", "content": "x", "\\udc00": 1}], "temperature": 0, "stream": true}',
            "application/json",
            400,
            "messages[0]",
        ),
        ("[" * 10_000 + "]" * 10_000, "application/json", 400, None),
        ('{"a": ' * 100_000 + "1" + "}" * 100_000, "application/json", 400, None),
        ('{"messages": [{"role": "user", "content": "x"}], "temperature": 0}', "text/plain", 415, None),
        (
            '{"messages": [{"role": "user", "content": "x"}], "temperature": 0}',
            "application/x-www-form-urlencoded",
            415,
            None,
        ),
    ],
)
def test_hostile_bodies_are_refused_before_anything_is_forwarded(
    fake, make_gateway, raw, content_type, status, param
):
    gw = make_gateway(fake.url)
    with httpx.Client(timeout=20) as h:
        r = h.post(gw.url + CHAT, content=raw.encode(), headers={"content-type": content_type})
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
    assert fake.state.calls == 0


def test_a_surrogate_pair_is_fine(fake, make_gateway):
    gw = make_gateway(fake.url)
    with httpx.Client(timeout=20) as h:
        r = h.post(
            gw.url + CHAT,
            content=b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "temperature": 0}',
            headers={"content-type": "application/json"},
        )
    assert r.status_code == 200 and fake.state.calls == 1


def test_an_internal_error_is_a_json_500_without_secrets_and_keeps_the_connection(
    fake, make_gateway, monkeypatch, caplog, capfd
):
    caplog.set_level(logging.DEBUG)
    url = fake.url + f"/v1?api_key={SECRET}"
    gw = make_gateway(url, api_key=UP_KEY)
    real_plan = gw.cache.plan

    def broken_plan(*a, **kw):
        raise RuntimeError(f"planner exploded near {url} with {UP_KEY}")

    body = {"model": "fake-model", "messages": MSG, "temperature": 0}
    with httpx.Client(timeout=20) as h:
        monkeypatch.setattr(gw.cache, "plan", broken_plan)
        r = h.post(gw.url + CHAT, json=body)
        port_500 = r.extensions["network_stream"].get_extra_info("client_addr")[1]
        monkeypatch.setattr(gw.cache, "plan", real_plan)
        ok = h.post(gw.url + CHAT, json=body)
        port_ok = ok.extensions["network_stream"].get_extra_info("client_addr")[1]
    assert r.status_code == 500
    err = r.json()["error"]
    rid = r.headers["x-request-id"]
    assert err["code"] == "internal_error" and rid in err["message"] and "exploded" not in r.text
    assert_clean(r.text)
    assert ok.status_code == 200 and port_ok == port_500
    gateway_logs = [rec.getMessage() for rec in caplog.records if rec.name == "tokenseam.gateway"]
    assert any(rid in m and "planner exploded" in m for m in gateway_logs)
    assert_clean(caplog.text)
    assert_clean(capfd.readouterr().err)


def test_host_check_and_cors_in_the_gateway(fake, make_gateway):
    gw = make_gateway(
        fake.url, allowed_hosts=["localhost", "127.0.0.1"], cors_origins=["https://app.example"]
    )
    body = {"model": "fake-model", "messages": MSG, "temperature": 0}
    with httpx.Client(timeout=20) as h:
        evil = h.post(gw.url + CHAT, json=body, headers={"host": "evil.example"})
        assert evil.status_code == 400 and evil.json()["error"]["code"] == "invalid_host"
        assert h.get(gw.url + "/health", headers={"host": f"evil.example:{gw.port}"}).status_code == 400
        assert fake.state.calls == 0
        r = h.post(
            gw.url + CHAT,
            json=body,
            headers={"host": f"localhost:{gw.port}", "origin": "https://app.example"},
        )
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        assert "x-tokenseam-cache" in r.headers["access-control-expose-headers"]
        pre = h.options(
            gw.url + CHAT, headers={"origin": "https://app.example", "access-control-request-method": "POST"}
        )
        assert pre.status_code == 204
        denied = h.options(
            gw.url + CHAT, headers={"origin": "https://evil.example", "access-control-request-method": "POST"}
        )
        assert denied.status_code == 403
