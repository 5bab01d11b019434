"""The server as an attacker or a careless client meets it: media type, Host, API keys, CORS, clients that
leave, size limits, full preparation pools, a stuck engine, SIGTERM with streams running."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tokenseam.bench.common import free_port
from tokenseam.httpkit import BackgroundServer, default_allowed_hosts
from tokenseam.server.app import MAX_TOKENIZE_CHARS, create_app
from tokenseam.server.pool import WorkPool

pytestmark = [pytest.mark.model, pytest.mark.server]

KEY = "sk-test-0f3c"


@pytest.fixture(scope="module")
def guarded(smollm2_server):
    """A second app over the same engine, with keys, the loopback Host list and one CORS origin."""
    app = create_app(
        smollm2_server.state,
        api_keys=[KEY],
        allowed_hosts=default_allowed_hosts("127.0.0.1"),
        cors_origins=["https://app.example"],
    )
    bg = BackgroundServer(app).start()
    yield bg.url
    bg.stop()


def _generated(state) -> int:
    return state.engine.stats.generated_tokens


def test_text_plain_post_is_refused_before_anything_runs(smollm2_server):
    before = _generated(smollm2_server.state)
    r = httpx.post(
        smollm2_server.url + "/v1/completions",
        content=json.dumps({"prompt": "Hi", "max_tokens": 4}),
        headers={"Content-Type": "text/plain"},
    )
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    assert _generated(smollm2_server.state) == before


@pytest.mark.parametrize(
    "raw,needle",
    [
        (b"[" * 10_000 + b"]" * 10_000, "deep"),
        (b'{"prompt": "\\ud800", "max_tokens": 2}', "surrogate"),
        (b'{"prompt": "x", "temperature": NaN}', "NaN"),
    ],
)
def test_hostile_json_is_a_400_that_says_why(smollm2_server, raw, needle):
    r = httpx.post(
        smollm2_server.url + "/v1/completions", content=raw, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400
    assert needle.lower() in r.json()["error"]["message"].lower()


def test_api_keys_host_check_and_cors(guarded):
    body = {"prompt": "Hi", "max_tokens": 2}
    assert httpx.post(guarded + "/v1/completions", json=body).status_code == 401
    wrong = httpx.post(guarded + "/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"].startswith("Bearer")
    assert "nope" not in wrong.text
    assert (
        httpx.post(
            guarded + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
        ).status_code
        == 200
    )
    assert httpx.get(guarded + "/metrics").status_code == 401
    assert httpx.get(guarded + "/health").status_code == 200  # for load balancers
    # DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends its own Host
    rebound = httpx.get(guarded + "/health", headers={"Host": "evil.example"})
    assert rebound.status_code == 400
    pre = httpx.options(
        guarded + "/v1/completions",
        headers={
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "https://app.example"
    other = httpx.options(
        guarded + "/v1/completions",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


def test_no_cors_headers_unless_configured(smollm2_server):
    r = httpx.post(
        smollm2_server.url + "/v1/completions",
        json={"prompt": "Hi", "max_tokens": 2},
        headers={"Origin": "https://evil.example"},
    )
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_non_streamed_client_that_leaves_stops_its_generation(smollm2_server):
    state = smollm2_server.state
    host, port = smollm2_server.url.removeprefix("http://").split(":")
    body = json.dumps(
        {"prompt": "Tell a long story.", "max_tokens": 400, "ignore_eos": True, "temperature": 0.8}
    ).encode()
    before = _generated(state)
    s = socket.create_connection((host, int(port)))
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    deadline = time.monotonic() + 30
    while _generated(state) - before < 5 and time.monotonic() < deadline:  # decoding has started
        time.sleep(0.01)
    s.close()
    deadline = time.monotonic() + 10
    while state.engine.running_count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state.engine.running_count == 0
    # 400 tokens if nobody noticed; tokens keep flowing, so a check only after a quiet spell never fires
    assert _generated(state) - before < 200


def test_tokenize_limits_and_types(smollm2_server):
    url = smollm2_server.url
    big = httpx.post(url + "/tokenize", json={"content": "a" * (MAX_TOKENIZE_CHARS + 1)})
    assert big.status_code == 413
    assert httpx.post(url + "/tokenize", json={"content": "hi", "with_pieces": "yes"}).status_code == 400
    assert httpx.post(url + "/tokenize", json={"content": "hi", "with_pieces": True}).json()["tokens"][0][
        "piece"
    ]


def test_full_grammar_pool_is_503_with_retry_after_and_plain_requests_go_on(smollm2_server):
    state = smollm2_server.state
    saved = state.grammar_pool
    pool = WorkPool("grammar", 1, 0)
    release = threading.Event()
    holder = threading.Thread(target=lambda: asyncio.run(pool.run(release.wait, 30)))
    state.grammar_pool = pool
    try:
        holder.start()
        while pool.in_flight == 0:
            time.sleep(0.01)
        r = httpx.post(
            smollm2_server.url + "/v1/completions",
            json={"prompt": "x", "max_tokens": 2, "guided_regex": "[a-z]+"},
        )
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "server_busy"
        h = httpx.get(smollm2_server.url + "/health")
        assert h.status_code == 200 and h.json()["status"] == "degraded"
        assert (
            httpx.post(
                smollm2_server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}
            ).status_code
            == 200
        )
    finally:
        release.set()
        holder.join()
        state.grammar_pool = saved
    assert httpx.get(smollm2_server.url + "/health").json()["status"] == "ok"


def test_stuck_engine_makes_health_503(smollm2_server, monkeypatch):
    monkeypatch.setattr(smollm2_server.state.engine, "stalled_seconds", lambda: 120.0)
    h = httpx.get(smollm2_server.url + "/health")
    assert h.status_code == 503 and h.json()["status"] == "error"
    assert any("no progress" in p for p in h.json()["problems"])


def test_work_pool_counts_jobs_that_never_started():
    async def main() -> None:
        pool = WorkPool("t", 1, 1)
        gate = threading.Event()
        first = asyncio.ensure_future(pool.run(gate.wait, 10))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(pool.run(time.sleep, 0))
        await asyncio.sleep(0.05)
        with pytest.raises(Exception, match="busy"):
            await pool.run(time.sleep, 0)
        second.cancel()  # its client left before it started: the slot comes back
        await asyncio.sleep(0.05)
        assert pool.in_flight == 1
        gate.set()
        await first
        assert pool.in_flight == 0

    asyncio.run(main())


def test_sigterm_with_a_stream_running_exits_within_the_shutdown_timeout(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokenseam.cli",
            "serve",
            "--port",
            str(port),
            "--cache",
            "off",
            "--ctx-size",
            "2048",
            "--parallel",
            "1",
            "--shutdown-timeout",
            "2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "log", "wb"),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        got = threading.Event()

        def stream() -> None:
            try:
                with httpx.stream(
                    "POST",
                    url + "/v1/completions",
                    json={"prompt": "Once", "max_tokens": 1500, "ignore_eos": True, "stream": True},
                    timeout=60,
                ) as r:
                    for _ in r.iter_bytes():
                        got.set()
            except httpx.HTTPError:
                pass

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        assert got.wait(60)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        took = time.monotonic() - t0
        # uvicorn re-raises the signal once drained, so the exit status says SIGTERM, as for any daemon
        assert rc in (0, -signal.SIGTERM), (tmp_path / "log").read_text()[-2000:]
        assert "timeout graceful shutdown exceeded" in (tmp_path / "log").read_text()
        assert took < 2 + 20  # the drain timeout plus the engine's own stop, far below the 1,500-token stream
    finally:
        if proc.poll() is None:
            proc.kill()


def test_client_chosen_paths_do_not_grow_the_metrics(smollm2_server):
    for i in range(20):
        assert httpx.get(f"{smollm2_server.url}/v1/models/no-such-model-{i}").status_code == 404
    text = httpx.get(smollm2_server.url + "/metrics").text
    assert "no-such-model" not in text
    assert 'route="/v1/models/{name}",status="404"' in text


def test_serve_keys_from_flags_env_and_default_variable(monkeypatch):
    import argparse

    from tokenseam.server.cli_serve import serve_keys

    monkeypatch.setenv("TOKENSEAM_API_KEY", "k3, k1")
    monkeypatch.setenv("TS_KEYS", "k4")
    flags = argparse.Namespace(api_key=["k1", " k2 "], api_key_env=None)
    assert serve_keys(flags) == ["k1", "k2", "k3"]
    # --api-key-env names the variable: TOKENSEAM_API_KEY is then not read
    assert serve_keys(argparse.Namespace(api_key=None, api_key_env="TS_KEYS")) == ["k4"]
    monkeypatch.delenv("TOKENSEAM_API_KEY")
    assert serve_keys(argparse.Namespace(api_key=None, api_key_env=None)) == []
