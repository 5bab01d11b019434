"""The gateway in front of tokenseam's own server (SmolLM2 through llama.cpp): live vs replayed streams, token ids."""

from __future__ import annotations

import httpx
import openai
import pytest

from tokenseam.respcache.entry import SSEParser

pytestmark = [pytest.mark.model, pytest.mark.server]


@pytest.fixture(scope="module")
def tokenseam_upstream():
    from tokenseam.httpkit import BackgroundServer
    from tokenseam.server.runtime import build_server

    app, state = build_server("smollm2", n_ctx=1024, parallel=2, threads=2)
    bg = BackgroundServer(app).start()
    yield bg
    bg.stop()
    state.engine.shutdown()


@pytest.fixture
def gateway(tokenseam_upstream):
    from prometheus_client import CollectorRegistry

    from tokenseam.gateway import create_gateway_app
    from tokenseam.httpkit import BackgroundServer
    from tokenseam.respcache import MemoryStore, ResponseCache

    reg = CollectorRegistry()
    # max_tokens-capped answers end with finish_reason=length; cache them here so short tests can hit.
    cache = ResponseCache(MemoryStore(), registry=reg, cache_truncated=True)
    with BackgroundServer(create_gateway_app(tokenseam_upstream.url, cache=cache, registry=reg)) as gw:
        yield gw


def test_streamed_hit_replays_the_live_events_and_ids(gateway):
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Write one sentence about rivers."}],
        "temperature": 0,
        "max_tokens": 12,
        "stream": True,
        "return_token_ids": True,
    }
    with httpx.Client(timeout=120) as h:
        live = h.post(gateway.url + "/v1/chat/completions", json=body)
        hit = h.post(gateway.url + "/v1/chat/completions", json=body)
        full = h.post(gateway.url + "/v1/chat/completions", json=dict(body, stream=False))
    assert live.status_code == 200, live.text
    assert (
        live.headers["x-tokenseam-cache"],
        hit.headers["x-tokenseam-cache"],
        full.headers["x-tokenseam-cache"],
    ) == ("miss", "hit", "hit")
    a, b = SSEParser().feed(live.content), SSEParser().feed(hit.content)
    assert a[-1] == b[-1] == "[DONE]" and len(a) == len(b) > 3
    assert [x["choices"] for x in a[:-1]] == [x["choices"] for x in b[:-1]]
    ids = [t for x in b[:-1] for t in x["choices"][0].get("token_ids") or []]
    last = b[-2]["choices"][0]
    assert last["all_token_ids"] == ids and len(ids) == 12
    f = full.json()["choices"][0]
    assert f["token_ids"] == ids
    assert f["message"]["content"] == "".join(x["choices"][0]["delta"].get("content") or "" for x in b[:-1])


def test_openai_client_through_gateway_to_tokenseam(gateway):
    c = openai.OpenAI(base_url=gateway.url + "/v1", api_key="k", max_retries=0, timeout=120)
    kw = dict(model="smollm2", prompt="The capital of France is", temperature=0, max_tokens=8)
    first = c.completions.with_raw_response.create(**kw)
    second = c.completions.with_raw_response.create(**kw, stream=False, extra_body={"_trace": "x"})
    assert (first.headers["x-tokenseam-cache"], second.headers["x-tokenseam-cache"]) == ("miss", "hit")
    assert first.parse().choices[0].text == second.parse().choices[0].text != ""
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(**kw, stream=True))
    assert streamed == first.parse().choices[0].text
