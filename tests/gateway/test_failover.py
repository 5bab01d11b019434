"""Several replicas behind one gateway: routing header, retries on another replica, ejection and return,
in-flight limits, 503 + Retry-After only when no replica can serve, per-replica metrics."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import openai
import pytest

from tokenseam.testing.fake_upstream import FakeUpstream

SYSTEM = {"role": "system", "content": "You are the support bot of a bicycle shop. " * 10}


def client_for(gw):
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0, timeout=30)


def route_of(headers) -> dict[str, str]:
    return dict(part.strip().split("=", 1) for part in headers["x-tokenseam-route"].split(";"))


def ask(c, question, system=SYSTEM, **kw):
    return c.chat.completions.with_raw_response.create(
        model="fake-model", messages=[system, {"role": "user", "content": question}], temperature=0, **kw
    )


def served_by(fakes):
    return [f.state.calls for f in fakes]


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.05)


def test_one_system_prompt_stays_on_its_home_until_its_share_is_full(replicas, gateway):
    gw = gateway([f.url for f in replicas])
    c = client_for(gw)
    routes = [route_of(ask(c, f"question {i}").headers) for i in range(12)]
    assert len({r["key"] for r in routes}) == 1
    # the first 8 (SHARE_FLOOR) on the key's home; then its share is over the bound and the rest spill, all
    # to one second replica
    assert len({r["replica"] for r in routes[:8]}) == 1 and {r["reason"] for r in routes[:8]} == {"prefix"}
    assert {r["reason"] for r in routes[8:]} == {"spill"} and len({r["replica"] for r in routes[8:]}) == 1
    assert sorted(served_by(replicas)) == [0, 4, 8]
    # Different system prompts spread over the replicas.
    for i in range(30):
        ask(c, "q", system={"role": "system", "content": f"app number {i}"})
    assert min(served_by(replicas)) > 0
    # A cache hit names no replica.
    again = ask(c, "question 3")
    assert again.headers["x-tokenseam-cache"] == "hit" and route_of(again.headers)["reason"] == "cache"


def test_a_replica_answering_503_is_retried_elsewhere(replicas, gateway):
    gw = gateway([f.url for f in replicas], fail_threshold=5)
    c = client_for(gw)
    home = route_of(ask(c, "warm up").headers)["replica"]
    home_fake = next(f for f in replicas if home.endswith(str(f.port)))
    home_fake.set_mode("error", count=1, status=503)
    r = ask(c, "now")
    got = route_of(r.headers)
    assert r.parse().choices[0].message.content and got["replica"] != home
    assert got["reason"] == "retry" and got["attempts"] == "2"
    # Streams too, while no event has reached the client.
    home_fake.set_mode("error", count=1, status=502)
    with httpx.Client(timeout=30) as h:
        s = h.post(
            gw.url + "/v1/chat/completions",
            json={
                "model": "fake-model",
                "messages": [SYSTEM, {"role": "user", "content": "stream"}],
                "temperature": 0,
                "stream": True,
            },
        )
    assert s.status_code == 200 and "[DONE]" in s.text and route_of(s.headers)["attempts"] == "2"


def test_a_request_error_is_not_retried(replicas, gateway):
    gw = gateway([f.url for f in replicas])
    for f in replicas:
        f.set_mode("error", count=1, status=400)
    with httpx.Client(timeout=30) as h:
        r = h.post(gw.url + "/v1/chat/completions", json={"messages": [SYSTEM], "temperature": 0})
    assert r.status_code == 400 and sum(served_by(replicas)) == 1


def test_a_killed_replica_is_ejected_and_returns_when_healthy(replicas, gateway):
    gw = gateway([f.url for f in replicas], health_interval=0.2)
    c = client_for(gw)
    home = route_of(ask(c, "warm up").headers)["replica"]
    victim = next(f for f in replicas if home.endswith(str(f.port)))
    port = victim.port
    victim.stop()
    for i in range(10):  # every request still succeeds, none on the dead replica
        r = ask(c, f"after the kill {i}")
        assert r.parse().choices[0].message.content
        assert route_of(r.headers)["replica"] != home
    health = httpx.get(gw.url + "/health").json()
    dead = next(x for x in health["replicas"] if x["name"] == home)
    assert health["status"] == "degraded" and dead["healthy"] is False and dead["last_error"]
    revived = FakeUpstream(port=port).start()
    replicas[replicas.index(victim)] = revived
    wait_for(lambda: all(x["healthy"] for x in httpx.get(gw.url + "/health").json()["replicas"]))
    r = ask(c, "after the return")
    assert route_of(r.headers)["replica"] == home and revived.state.calls == 1


def test_no_replica_left_is_a_503_with_retry_after(replicas, gateway):
    gw = gateway([f.url for f in replicas], health_interval=1)
    for f in replicas:
        f.set_mode("error", status=503)
    with httpx.Client(timeout=30) as h:
        r = h.post(gw.url + "/v1/chat/completions", json={"messages": [SYSTEM], "temperature": 0})
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert sum(served_by(replicas)) == 3  # each replica was tried once
        for f in replicas:
            f.stop()
        r = h.post(
            gw.url + "/v1/chat/completions", json={"messages": [SYSTEM], "temperature": 0, "stream": True}
        )
        assert r.status_code == 502 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "upstream_unreachable"
        health = h.get(gw.url + "/health")
    assert health.status_code == 503 and health.json()["status"] == "unavailable"


def test_in_flight_limit_queues_then_503(replicas, gateway):
    slow = replicas[0]
    slow.state.latency = 1.0
    gw = gateway([slow.url], max_in_flight=2, queue_timeout=0.3)
    body = {"messages": [SYSTEM, {"role": "user", "content": "x"}], "temperature": 0.7}  # not cached

    def post(_):
        with httpx.Client(timeout=30) as h:
            return h.post(gw.url + "/v1/chat/completions", json=body)

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        results = list(ex.map(post, range(4)))
    codes = sorted(r.status_code for r in results)
    assert codes == [200, 200, 503, 503], codes
    refused = next(r for r in results if r.status_code == 503)
    assert "in-flight limit" in refused.json()["error"]["message"] and refused.headers["retry-after"] == "1"
    assert gw.pool.replicas[0].in_flight == 0


def test_a_client_that_leaves_mid_stream_frees_its_slot(replicas, gateway):
    f = replicas[0]
    f.state.token_delay = 0.2
    gw = gateway([f.url])
    body = {"messages": [SYSTEM], "temperature": 0.5, "stream": True, "max_tokens": 12}
    with httpx.Client(timeout=30) as h, h.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
        for _ in r.iter_lines():
            break
    wait_for(lambda: gw.pool.replicas[0].in_flight == 0)


def test_a_stream_that_breaks_after_events_is_not_retried(replicas, gateway):
    gw = gateway([f.url for f in replicas])
    for f in replicas:
        f.set_mode("midstream", count=1)
    with httpx.Client(timeout=30) as h:
        r = h.post(
            gw.url + "/v1/chat/completions",
            json={"messages": [SYSTEM], "temperature": 0, "stream": True, "max_tokens": 12},
        )
    assert r.status_code == 200 and '"error"' in r.text and sum(served_by(replicas)) == 1


def test_metrics_per_replica(replicas, gateway):
    gw = gateway([f.url for f in replicas])
    c = client_for(gw)
    for i in range(6):
        ask(c, "m", system={"role": "system", "content": f"app {i}"})
    text = httpx.get(gw.url + "/metrics").text
    for f in replicas:
        name = f"127.0.0.1:{f.port}"
        assert f'tokenseam_gateway_upstream_in_flight{{replica="{name}"}} 0.0' in text
        assert f'tokenseam_gateway_upstream_healthy{{replica="{name}"}} 1.0' in text
    assert text.count('tokenseam_gateway_upstream_requests_total{outcome="ok"') == len(
        [f for f in replicas if f.state.calls]
    )
    assert "tokenseam_gateway_upstream_latency_seconds_bucket" in text
    assert 'tokenseam_gateway_routes_total{reason="prefix"} 6.0' in text


def test_models_fail_over_too(replicas, gateway):
    gw = gateway([f.url for f in replicas])
    replicas[0].stop()
    replicas[1].stop()
    for _ in range(3):
        r = httpx.get(gw.url + "/v1/models")
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "fake-model"


def test_kinds_are_detected(replicas, gateway):
    gw = gateway([f.url for f in replicas])
    wait_for(lambda: all(r.detected for r in gw.pool.replicas))
    assert {r.kind for r in gw.pool.replicas} == {"openai"}  # the fake says owned_by "fake"


@pytest.mark.parametrize("routing", ["least-loaded", "round-robin"])
def test_other_policies_spread_one_prompt(replicas, gateway, routing):
    gw = gateway([f.url for f in replicas], routing=routing)
    c = client_for(gw)
    for i in range(9):
        ask(c, f"q{i}")
    assert min(served_by(replicas)) >= 1


def test_waiters_of_a_stream_that_breaks_mid_way_start_over(replicas, gateway):
    # Identical streams coalesce on one leader; its replica dies after two events. The leader's client gets
    # the error event; the waiters are not given that error as their answer: one of them leads again.
    f = replicas[0]
    f.state.token_delay = 0.3
    gw = gateway([f.url])
    f.set_mode("midstream", count=1)
    body = {"model": "fake-model", "messages": [SYSTEM], "temperature": 0, "stream": True, "max_tokens": 12}

    def post(_):
        with httpx.Client(timeout=30) as h:
            return h.post(gw.url + "/v1/chat/completions", json=body)

    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        first = ex.submit(post, 0)
        time.sleep(0.2)
        rest = list(ex.map(post, range(2)))
    assert first.result().status_code == 200 and '"error"' in first.result().text
    for r in rest:
        assert r.status_code == 200 and '"error"' not in r.text and "[DONE]" in r.text, r.text
