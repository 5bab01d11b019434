"""Two gateways sharing one real redis-server: one generation for identical concurrent requests across both
(a Redis lock with expiry), a dead lock holder taken over, Redis down -> pass-through, never a 500."""

from __future__ import annotations

import concurrent.futures
import uuid

import httpx
import pytest

from tests.respcache.conftest import running_redis
from tokenseam.respcache import RedisStore
from tokenseam.testing.fake_upstream import FakeUpstream

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory):
    with running_redis(tmp_path_factory.mktemp("redis-gw")) as port:
        yield port


def store(port, prefix):
    return RedisStore(f"redis://127.0.0.1:{port}/0", prefix=prefix)


def body(question, stream=False):
    return {
        "model": "fake-model",
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "stream": stream,
        "return_token_ids": True,
    }


def post_all(urls_and_bodies):
    def one(ub):
        url, b = ub
        with httpx.Client(timeout=60) as h:
            return h.post(url + CHAT, json=b)

    with concurrent.futures.ThreadPoolExecutor(len(urls_and_bodies)) as ex:
        return list(ex.map(one, urls_and_bodies))


@pytest.mark.parametrize("stream", [False, True])
def test_identical_requests_through_two_gateways_generate_once(gateway, redis_port, stream):
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    with FakeUpstream() as up:
        up.state.latency = 0.6
        a = gateway([up.url], store=store(redis_port, prefix))
        b = gateway([up.url], store=store(redis_port, prefix))
        q = body(f"same question {stream}", stream)
        results = post_all([(a.url, q)] * 4 + [(b.url, q)] * 4)
        assert [r.status_code for r in results] == [200] * 8
        assert up.state.calls == 1, up.state.calls
        if stream:
            texts = {r.text.count("data: ") for r in results}
            assert len(texts) == 1  # the same events everywhere
        else:
            assert len({r.json()["choices"][0]["message"]["content"] for r in results}) == 1
            assert len({tuple(r.json()["choices"][0]["token_ids"]) for r in results}) == 1
        assert sorted(r.headers["x-tokenseam-cache"] for r in results).count("miss") == 1
        waits = a.cache.stats["cross_process_waits"] + b.cache.stats["cross_process_waits"]
        assert waits >= 1


def test_a_lock_whose_holder_died_expires_and_is_taken_over(gateway, redis_port):
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    with FakeUpstream() as up:
        gw = gateway([up.url], store=store(redis_port, prefix))
        gw.cache.lock_seconds = 0.5
        q = body("orphaned lock")
        plan = gw.cache.plan(CHAT, q, {}, tenant="")
        # A process took the lock and died: its lock is never released, only expires.
        assert store(redis_port, prefix).try_lock(plan.fingerprint, "dead-process", 0.8)
        r = httpx.post(gw.url + CHAT, json=q, timeout=30)
        assert r.status_code == 200 and up.state.calls == 1 and r.headers["x-tokenseam-cache"] == "miss"
        again = httpx.post(gw.url + CHAT, json=q, timeout=30)
        assert again.headers["x-tokenseam-cache"] == "hit"


def test_the_leader_keeps_its_lock_through_a_long_generation(gateway, redis_port):
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    with FakeUpstream() as up:
        up.state.latency = 1.5  # three lock lifetimes
        a = gateway([up.url], store=store(redis_port, prefix))
        b = gateway([up.url], store=store(redis_port, prefix))
        for g in (a, b):
            g.cache.lock_seconds = 0.5
        q = body("long one")
        results = post_all([(a.url, q), (b.url, q), (b.url, q)])
        assert [r.status_code for r in results] == [200] * 3 and up.state.calls == 1


def test_redis_down_mid_load_passes_through(gateway, tmp_path):
    with FakeUpstream() as up:
        with running_redis(tmp_path) as port:
            a = gateway([up.url], store=store(port, "down:"))
            b = gateway([up.url], store=store(port, "down:"))
            assert httpx.post(a.url + CHAT, json=body("before"), timeout=30).status_code == 200
            # Kill the server under both gateways.
            store(port, "down:")._r.shutdown(nosave=True)
        for stream in (False, True):
            results = post_all(
                [(g.url, body(f"during {i} {stream}", stream)) for g in (a, b) for i in range(4)]
            )
            assert {r.status_code for r in results} == {200}, [
                r.text for r in results if r.status_code != 200
            ]
            assert {r.headers["x-tokenseam-cache"] for r in results} == {"bypass"}
        health = httpx.get(b.url + "/health").json()
        assert health["status"] == "degraded" and "cache store" in " ".join(health["problems"])
