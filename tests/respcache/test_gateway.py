"""The gateway against a real local fake upstream: the openai client as caller, SSE replay, failure mapping."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from tokenseam.respcache import RedisStore, SQLiteStore, normalize_request
from tokenseam.respcache.entry import SSEParser
from tokenseam.testing.fake_upstream import fake_answer

from .conftest import free_port

pytestmark = pytest.mark.server

MSG = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a river."}]


def client_for(gw, key="sk-test"):
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=20)


def expected_text(body, route="/v1/chat/completions", index=0):
    return "".join(fake_answer(normalize_request(route, body), index)[0])


def sse_events(resp: httpx.Response):
    return SSEParser().feed(resp.content)


def test_openai_non_streamed_miss_then_hit(fake, make_gateway):
    gw = make_gateway(fake.url)
    c = client_for(gw)
    raw1 = c.chat.completions.with_raw_response.create(
        model="fake-model", messages=MSG, temperature=0, max_tokens=50
    )
    raw2 = c.chat.completions.with_raw_response.create(
        model="fake-model", messages=list(reversed(MSG))[::-1], temperature=0.0, max_tokens=50, user="bob"
    )
    r1, r2 = raw1.parse(), raw2.parse()
    assert raw1.headers["x-tokenseam-cache"] == "miss" and raw2.headers["x-tokenseam-cache"] == "hit"
    assert (
        r1.choices[0].message.content
        == r2.choices[0].message.content
        == expected_text({"model": "fake-model", "messages": MSG, "temperature": 0, "max_tokens": 50})
    )
    assert r1.id != r2.id and fake.state.calls == 1
    # a sampling request is not cached by default
    raw3 = c.chat.completions.with_raw_response.create(model="fake-model", messages=MSG, max_tokens=50)
    assert raw3.headers["x-tokenseam-cache"] == "bypass"


def test_openai_streaming_miss_then_replayed_hit_event_by_event(fake, make_gateway):
    gw = make_gateway(fake.url)
    c = client_for(gw)
    kw = dict(
        model="fake-model",
        messages=MSG,
        temperature=0,
        max_tokens=50,
        stream=True,
        extra_body={"return_token_ids": True},
    )
    live = list(c.chat.completions.create(**kw))
    replay = list(c.chat.completions.create(**kw))
    assert fake.state.calls == 1
    text = expected_text(
        {"model": "fake-model", "messages": MSG, "temperature": 0, "max_tokens": 50, "return_token_ids": True}
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in live) == text
    assert len(replay) == len(live) > 3  # token by token, not one aggregated chunk
    for a, b in zip(live, replay, strict=True):
        assert a.object == b.object == "chat.completion.chunk"
        assert a.choices[0].delta.content == b.choices[0].delta.content
        assert a.choices[0].finish_reason == b.choices[0].finish_reason
        assert a.choices[0].model_extra.get("token_ids") == b.choices[0].model_extra.get("token_ids")
    assert replay[-1].choices[0].model_extra["all_token_ids"] == sum(
        (ch.choices[0].model_extra.get("token_ids") or [] for ch in replay[:-1]), []
    )
    # usage arrives only when asked for
    with_usage = list(c.chat.completions.create(**kw, stream_options={"include_usage": True}))
    assert with_usage[-1].choices == [] and with_usage[-1].usage.completion_tokens > 0
    assert all(ch.usage is None for ch in replay)


def test_stream_entry_serves_non_stream_and_back(fake, make_gateway):
    gw = make_gateway(fake.url)
    c = client_for(gw)
    base = dict(model="fake-model", temperature=0, max_tokens=40)
    streamed = "".join(
        ch.choices[0].delta.content or ""
        for ch in c.chat.completions.create(messages=MSG, stream=True, **base)
    )
    raw = c.chat.completions.with_raw_response.create(messages=MSG, **base)
    assert raw.headers["x-tokenseam-cache"] == "hit" and raw.parse().choices[0].message.content == streamed
    other = [{"role": "user", "content": "Another question."}]
    full = c.chat.completions.create(messages=other, **base).choices[0].message.content
    with c.chat.completions.with_streaming_response.create(messages=other, stream=True, **base) as resp:
        assert resp.headers["x-tokenseam-cache"] == "hit"
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    assert "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks) == full
    assert len(chunks) > 3
    assert fake.state.calls == 2


def test_completions_route_and_raw_sse_shapes(fake, make_gateway):
    gw = make_gateway(fake.url)
    body = {
        "model": "fake-model",
        "prompt": "The river",
        "temperature": 0,
        "max_tokens": 30,
        "stream": True,
        "return_token_ids": True,
    }
    with httpx.Client(timeout=20) as h:
        live = h.post(gw.url + "/v1/completions", json=body)
        hit = h.post(gw.url + "/v1/completions", json=body)
        non_stream = h.post(gw.url + "/v1/completions", json=dict(body, stream=False))
    assert (live.headers["x-tokenseam-cache"], hit.headers["x-tokenseam-cache"]) == ("miss", "hit")
    assert hit.headers["content-type"].startswith("text/event-stream")
    a, b = sse_events(live), sse_events(hit)
    assert a[-1] == b[-1] == "[DONE]"
    assert [x["choices"] for x in a[:-1]] == [x["choices"] for x in b[:-1]]
    assert all(x["object"] == "text_completion" for x in b[:-1])
    ns = non_stream.json()
    assert ns["choices"][0]["text"] == "".join(x["choices"][0]["text"] for x in b[:-1])
    assert ns["choices"][0]["token_ids"] == b[-2]["choices"][0]["all_token_ids"]
    assert fake.state.calls == 1


def test_bypass_header_and_tenant_isolation(fake, make_gateway):
    gw = make_gateway(fake.url)
    body = {"model": "fake-model", "messages": MSG, "temperature": 0}
    with httpx.Client(timeout=20) as h:
        h.post(gw.url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer k1"})
        same = h.post(gw.url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer k1"})
        other = h.post(gw.url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer k2"})
        byp = h.post(
            gw.url + "/v1/chat/completions",
            json=body,
            headers={"authorization": "Bearer k1", "x-tokenseam-cache": "bypass"},
        )
        nc = h.post(
            gw.url + "/v1/chat/completions",
            json=body,
            headers={"authorization": "Bearer k1", "cache-control": "no-cache"},
        )
    assert [r.headers["x-tokenseam-cache"] for r in (same, other, byp, nc)] == [
        "hit",
        "miss",
        "bypass",
        "bypass",
    ]
    assert fake.state.calls == 4


def test_upstream_errors_pass_through_with_status_and_body(fake, make_gateway):
    gw = make_gateway(fake.url)
    c = client_for(gw)
    fake.set_mode("error", count=1, status=429)
    with pytest.raises(openai.RateLimitError) as ei:
        c.chat.completions.create(model="fake-model", messages=MSG, temperature=0)
    assert ei.value.status_code == 429 and ei.value.body["code"] == "fake_failure"
    fake.set_mode("error", count=1, status=503)
    with httpx.Client(timeout=20) as h:
        r = h.post(gw.url + "/v1/chat/completions", json={"messages": MSG, "temperature": 0, "stream": True})
    assert r.status_code == 503 and r.json()["error"]["message"].startswith("fake upstream failure")
    # the error was not cached: the next identical request reaches the upstream and succeeds
    ok = c.chat.completions.with_raw_response.create(model="fake-model", messages=MSG, temperature=0)
    assert ok.headers["x-tokenseam-cache"] == "miss"


def test_timeouts_become_504_and_unreachable_upstream_502(fake, make_gateway):
    gw = make_gateway(fake.url, timeout=0.5)
    fake.set_mode("hang", count=2)
    with httpx.Client(timeout=20) as h:
        for stream in (False, True):
            r = h.post(
                gw.url + "/v1/chat/completions", json={"messages": MSG, "temperature": 0, "stream": stream}
            )
            assert r.status_code == 504
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["code"] == "upstream_timeout"
    dead = make_gateway(f"http://127.0.0.1:{free_port()}")
    c = client_for(dead)
    with pytest.raises(openai.APIStatusError) as ei:
        c.chat.completions.create(model="fake-model", messages=MSG, temperature=0)
    assert ei.value.status_code == 502 and ei.value.body["code"] == "upstream_unreachable"
    with httpx.Client(timeout=20) as h:
        assert h.get(dead.url + "/v1/models").status_code == 502
        r = h.post(
            dead.url + "/v1/chat/completions", json={"messages": MSG, "temperature": 0, "stream": True}
        )
        assert r.status_code == 502


def test_garbage_and_broken_streams_from_upstream(fake, make_gateway):
    gw = make_gateway(fake.url)
    with httpx.Client(timeout=20) as h:
        fake.set_mode("garbage", count=1)
        r = h.post(gw.url + "/v1/chat/completions", json={"messages": MSG, "temperature": 0})
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_bad_response"
        fake.set_mode("midstream", count=1)
        body = {"messages": MSG, "temperature": 0, "stream": True, "max_tokens": 50}
        r = h.post(gw.url + "/v1/chat/completions", json=body)
        evs = sse_events(r)
        assert r.status_code == 200 and "error" in evs[-1] and "[DONE]" not in evs
        fake.set_mode("nostream", count=1)
        ns = h.post(gw.url + "/v1/chat/completions", json=body)
        assert ns.status_code == 502 and ns.json()["error"]["code"] == "upstream_bad_response"
        again = h.post(gw.url + "/v1/chat/completions", json=body)
        assert again.headers["x-tokenseam-cache"] == "miss" and sse_events(again)[-1] == "[DONE]"


@pytest.mark.parametrize(
    "raw,status,code",
    [
        (b"{not json", 400, "invalid_json"),
        (b"", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_request"),
        (b'"text"', 400, "invalid_request"),
        (b"\xff\xfe", 400, "invalid_json"),
        (b'{"messages": []}', 400, "invalid_request"),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400, "invalid_json"),
        (b'{"messages": [{"role": "user", "content": "x"}], "n": "two"}', 400, "invalid_request"),
        (b'{"messages": [{"role": "user", "content": "' + b"x" * 3000 + b'"}]}', 413, "request_too_large"),
    ],
)
def test_malformed_and_oversized_bodies(fake, make_gateway, raw, status, code):
    gw = make_gateway(fake.url, max_body_bytes=2048)
    with httpx.Client(timeout=20) as h:
        r = h.post(gw.url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert err["code"] == code and err["message"] and set(err) == {"message", "type", "param", "code"}
    assert fake.state.calls == 0


def test_deeply_nested_bodies_are_rejected(fake, make_gateway):
    gw = make_gateway(fake.url)
    deep_msg = (
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": 0, "extra": '
        + b"[" * 900
        + b"]" * 900
        + b"}"
    )
    json_ct = {"content-type": "application/json"}
    with httpx.Client(timeout=20) as h:
        r = h.post(gw.url + "/v1/chat/completions", content=b"[" * 100_000 + b"]" * 100_000, headers=json_ct)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        r2 = h.post(gw.url + "/v1/chat/completions", content=deep_msg, headers=json_ct)
        assert r2.status_code == 400 and "nested more than 128" in r2.json()["error"]["message"]
    assert fake.state.calls == 0


def test_store_down_passes_through(fake, make_gateway):
    dead_redis = RedisStore(f"redis://127.0.0.1:{free_port()}/0", connect_timeout=0.2, socket_timeout=0.2)
    gw = make_gateway(fake.url, store=dead_redis)
    c = client_for(gw)
    for stream in (False, True):
        if stream:
            with c.chat.completions.with_streaming_response.create(
                model="fake-model", messages=MSG, temperature=0, stream=True
            ) as resp:
                assert resp.status_code == 200 and resp.headers["x-tokenseam-cache"] == "bypass"
                assert any("[DONE]" in line for line in resp.iter_lines())
        else:
            raw = c.chat.completions.with_raw_response.create(model="fake-model", messages=MSG, temperature=0)
            assert raw.status_code == 200 and raw.headers["x-tokenseam-cache"] == "bypass"
    assert fake.state.calls == 2
    assert gw.registry.get_sample_value("tokenseam_respcache_store_errors_total", {"op": "get"}) >= 1
    with httpx.Client(timeout=20) as h:
        health = h.get(gw.url + "/health").json()
    # still serving (requests go upstream), so degraded rather than down
    assert health["status"] == "degraded" and health["cache"]["ok"] is False and health["problems"]


def test_redis_and_sqlite_stores_through_the_gateway(fake, make_gateway, redis_url, tmp_path):
    for store in (RedisStore(redis_url, prefix="gwtest:"), SQLiteStore(tmp_path / "gw.sqlite")):
        gw = make_gateway(fake.url, store=store)
        c = client_for(gw)
        body = dict(model="fake-model", messages=MSG, temperature=0, seed=3)
        a = c.chat.completions.with_raw_response.create(**body)
        b = c.chat.completions.with_raw_response.create(**body)
        assert (a.headers["x-tokenseam-cache"], b.headers["x-tokenseam-cache"]) == ("miss", "hit")
        assert store.count() == 1
        store.clear()


def test_concurrent_identical_requests_reach_upstream_once(fake, make_gateway):
    gw = make_gateway(fake.url)
    fake.state.latency = 0.3
    body = {"model": "fake-model", "messages": MSG, "temperature": 0}

    async def go():
        async with httpx.AsyncClient(timeout=20) as h:

            async def one(i):
                r = await h.post(gw.url + "/v1/chat/completions", json=dict(body, stream=bool(i % 2)))
                if i % 2:
                    return r.headers["x-tokenseam-cache"], "".join(
                        e["choices"][0]["delta"].get("content") or "" for e in sse_events(r)[:-1]
                    )
                return r.headers["x-tokenseam-cache"], r.json()["choices"][0]["message"]["content"]

            return await asyncio.gather(*(one(i) for i in range(12)))

    results = asyncio.run(go())
    assert fake.state.calls == 1
    assert sorted(s for s, _ in results) == ["hit"] * 11 + ["miss"]
    assert {t for _, t in results} == {expected_text(body)}


def test_models_health_metrics(fake, make_gateway):
    gw = make_gateway(fake.url + "/v1")
    c = client_for(gw)
    assert [m.id for m in c.models.list()] == ["fake-model"]
    c.chat.completions.create(model="fake-model", messages=MSG, temperature=0)
    c.chat.completions.create(model="fake-model", messages=MSG, temperature=0)
    with httpx.Client(timeout=20) as h:
        assert h.get(gw.url + "/health").json()["cache"]["ok"] is True
        text = h.get(gw.url + "/metrics").text
        assert 'tokenseam_respcache_requests_total{result="hit",route="/v1/chat/completions"} 1.0' in text
        assert "tokenseam_respcache_hit_seconds_bucket" in text
        nf = h.get(gw.url + "/v1/nothing")
        assert nf.status_code == 404 and nf.json()["error"]["code"] == "not_found"
        assert h.get(gw.url + "/v1/chat/completions").status_code == 405


def test_upstream_key_replaces_client_key(fake, make_gateway):
    seen = []
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from tokenseam.httpkit import BackgroundServer

    async def echo(request):
        seen.append(request.headers.get("authorization"))
        return JSONResponse({"object": "list", "data": []})

    with BackgroundServer(Starlette(routes=[Route("/v1/models", echo)])) as up:
        gw = make_gateway(up.url, api_key="sk-upstream")
        plain = make_gateway(up.url)
        with httpx.Client(timeout=20) as h:
            h.get(gw.url + "/v1/models", headers={"authorization": "Bearer client"})
            h.get(plain.url + "/v1/models", headers={"authorization": "Bearer client"})
    assert seen == ["Bearer sk-upstream", "Bearer client"]
