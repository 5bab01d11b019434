"""The response cache in front of tokenseam's own engine: hits, SSE replay token by token, bypass."""

from __future__ import annotations

import httpx
import pytest

from .conftest import RunningServer
from .sse import stream_events

pytestmark = [pytest.mark.model, pytest.mark.server]


@pytest.fixture(scope="module")
def cached_server(tmp_path_factory):
    db = tmp_path_factory.mktemp("cache") / "responses.sqlite"
    s = RunningServer(
        "smollm2", n_ctx=512, parallel=2, cache_mode="deterministic", cache_store=f"sqlite:{db}"
    )
    yield s
    s.stop()


def test_miss_then_hit_with_same_body_in_any_key_order(cached_server):
    url = cached_server.url + "/v1/chat/completions"
    body = {
        "messages": [{"role": "user", "content": "Name a color."}],
        "max_tokens": 60,
        "temperature": 0,
        "return_token_ids": True,
        "stop": ["."],
    }  # truncated answers are never cached: let it stop
    r1 = httpx.post(url, json=body, timeout=60)
    assert r1.headers["x-tokenseam-cache"] == "miss"
    reordered = {k: body[k] for k in reversed(list(body))}
    reordered["messages"] = [{"content": "Name a color.  ", "role": "user"}]  # trailing whitespace: same key
    r2 = httpx.post(url, json=reordered, timeout=60)
    assert r2.headers["x-tokenseam-cache"] == "hit"
    a, b = r1.json(), r2.json()
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
    r3 = httpx.post(url, json=body, headers={"x-tokenseam-cache": "bypass"}, timeout=60)
    assert r3.headers["x-tokenseam-cache"] == "bypass"
    r4 = httpx.post(url, json={**body, "temperature": 0.7}, timeout=60)  # no seed: not deterministic
    assert r4.headers["x-tokenseam-cache"] == "bypass"


def test_stream_hit_is_replayed_token_by_token(cached_server):
    url = cached_server.url + "/v1/completions"
    # The answer is forced (greedy output differs between CPUs): multi-byte characters split across tokens.
    forced = cached_server.state.tokenizer.encode(
        " 안녕하세요 😊 and hello", add_special=False, parse_special=False
    )
    body = {
        "prompt": "Greeting in Korean:",
        "max_tokens": 60,
        "temperature": 0,
        "return_token_ids": True,
        "token_healing": False,
        "_force_ids": forced,
    }
    live = httpx.post(url, json=body, timeout=60).json()  # a non-streamed miss fills the cache
    assert live["choices"][0]["finish_reason"] == "stop"
    ids = live["choices"][0]["token_ids"]
    assert ids[: len(forced)] == forced
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as r:
        assert r.headers["x-tokenseam-cache"] == "hit"
    events, done = stream_events(url, {**body, "stream": True})
    assert done
    choice_events = [c for e in events for c in e["choices"]]
    assert len(choice_events) > 1  # not one aggregated chunk
    assert [t for c in choice_events for t in c.get("token_ids", [])] == ids
    assert "".join(c["text"] for c in choice_events) == live["choices"][0]["text"]


def test_bad_body_for_cache_is_400(cached_server):
    r = httpx.post(
        cached_server.url + "/v1/chat/completions", json={"messages": "nope", "temperature": 0}, timeout=30
    )
    assert r.status_code == 400 and r.json()["error"]["message"]


def test_an_answer_cut_by_its_stated_limit_is_cached(cached_server):
    """Classification-style calls (max_tokens 1, temperature 0) end on `length`: the limit is in the key, so
    the answer is the exact one for that request and the second call hits."""
    url = cached_server.url + "/v1/chat/completions"
    body = {
        "messages": [{"role": "user", "content": "Positive or negative: 'great film'"}],
        "max_tokens": 1,
        "temperature": 0,
        "_force_ids": cached_server.state.tokenizer.encode("Positive"),
    }
    first = httpx.post(url, json=body, timeout=60)
    assert (
        first.json()["choices"][0]["finish_reason"] == "length"
        and first.headers["x-tokenseam-cache"] == "miss"
    )
    second = httpx.post(url, json=body, timeout=60)
    assert second.headers["x-tokenseam-cache"] == "hit"
    assert second.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
