"""The fault set against a real server: no malformed body or hostile grammar gets a 5xx, the connection survives
every 4xx, and the answer is the same with the response cache on or off."""

from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tokenseam.bench.faults import hostile_grammars, malformed_cases, sample_cases

from .conftest import RunningServer

pytestmark = [pytest.mark.model, pytest.mark.server]

N_CASES = 700  # a seeded sample of the full set (run all of it with `tokenseam bench chaos`)
GRAMMAR_SECONDS = 3.0  # the second server's compile budget, so the hostile set runs in seconds


@pytest.fixture(scope="module")
def cached_server():
    s = RunningServer(
        "smollm2",
        n_ctx=512,
        parallel=2,
        cache_mode="deterministic",
        cache_store="memory",
        grammar_seconds=GRAMMAR_SECONDS,
    )
    yield s
    s.stop()


class Conn:
    """One keep-alive connection, so a server that drops it after an error is seen (httpx would reconnect)."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname, u.port
        self.resets = 0
        self._open()

    def _open(self) -> None:
        self.c = http.client.HTTPConnection(self.host, self.port, timeout=120)

    def post(self, route: str, body: bytes, ctype: str) -> tuple[int, bytes]:
        headers = {"Content-Type": ctype} if ctype else {}
        try:
            self.c.request("POST", route, body=body, headers=headers)
            r = self.c.getresponse()
            data = r.read()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            self.resets += 1
            self.c.close()
            self._open()
            return -1, b""
        if r.getheader("connection", "").lower() == "close":
            self.resets += 1
            self.c.close()
            self._open()
        return r.status, data


def _replay(url: str, cases) -> tuple[dict[str, int], int]:
    conn = Conn(url)
    out = {}
    for case in cases:
        status, _ = conn.post(case.route, case.body, case.content_type)
        out[f"{case.route} {case.what}"] = status
    return out, conn.resets


def test_fault_set_is_large():
    assert len(malformed_cases()) > 1500


def test_no_5xx_and_same_answer_with_cache_on_or_off(smollm2_server, cached_server):
    cases = sample_cases(N_CASES, seed=16)
    off, resets_off = _replay(smollm2_server.url, cases)
    on, resets_on = _replay(cached_server.url, cases)
    fives = {
        k: v for k, v in {**off, **{k + " (cache)": v for k, v in on.items()}}.items() if v >= 500 or v < 0
    }
    assert not fives, "\n".join(f"{k}: {v}" for k, v in sorted(fives.items()))
    assert resets_off == 0 and resets_on == 0
    differ = {k: (off[k], on[k]) for k in off if off[k] != on[k]}
    assert not differ, "\n".join(f"{k}: off {a}, on {b}" for k, (a, b) in sorted(differ.items()))
    assert sum(1 for v in off.values() if 400 <= v < 500) > len(cases) // 2  # the set really is malformed
    for s in (smollm2_server, cached_server):
        assert httpx.get(s.url + "/health").json()["status"] == "ok"


@pytest.mark.parametrize("name,fields", hostile_grammars(), ids=[n for n, _ in hostile_grammars()])
def test_hostile_grammar_is_answered_within_its_budget_and_plain_requests_go_on(cached_server, name, fields):
    t0 = time.monotonic()
    r = httpx.post(
        cached_server.url + "/v1/completions",
        json={"prompt": "x", "max_tokens": 2, "temperature": 0, **fields},
        timeout=120,
    )
    took = time.monotonic() - t0
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code != 200:  # some of the set compile (lazily built automata): then they must just work
        assert r.json()["error"]["message"]
    assert took < 2 * GRAMMAR_SECONDS + 5  # the promised bound (2x the budget), not a timing
    ok = httpx.post(
        cached_server.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=60
    )
    assert ok.status_code == 200


def _raw_post(url: str, body: dict):
    import socket

    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    s = socket.create_connection((host, int(port)))
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return s


def test_streamed_client_that_leaves_while_queued_is_not_an_error(cached_server, caplog):
    state = cached_server.state
    long = {"prompt": "Tell a long story.", "max_tokens": 300, "ignore_eos": True, "temperature": 0.8}
    busy = [_raw_post(cached_server.url, long) for _ in range(state.engine.n_slots)]
    deadline = time.monotonic() + 30
    while state.engine.running_count < state.engine.n_slots and time.monotonic() < deadline:
        time.sleep(0.01)
    caplog.clear()
    queued = _raw_post(cached_server.url, {**long, "stream": True})
    while state.engine.queue_depth == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state.engine.queue_depth == 1
    queued.close()
    time.sleep(1.0)  # the queued request notices (it checks twice a second) while the slots are still taken
    for s in busy:
        s.close()
    deadline = time.monotonic() + 30
    while (state.engine.running_count or state.engine.queue_depth) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [r for r in caplog.records if r.levelname == "ERROR"], [
        r.getMessage()[:200] for r in caplog.records
    ]
    metrics = httpx.get(cached_server.url + "/metrics").text
    assert 'status="500"' not in metrics
