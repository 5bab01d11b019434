"""`tokenseam gateway` as a real process in front of the fake upstream: start, serve a miss then a hit, stop."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from .conftest import free_port

pytestmark = pytest.mark.server


def _wait_health(proc, url: str) -> httpx.Response:
    """The gateway's first /health answer, waiting up to 60 s for it to start (failing if it exits)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return httpx.get(url + "/health", timeout=1)
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "gateway did not start"
        time.sleep(0.1)


def test_gateway_command_serves_from_sqlite(fake, tmp_path):
    port = free_port()
    db = tmp_path / "cli.sqlite"
    env = dict(os.environ, TS_UP_KEY="sk-up", TS_CLIENT_KEYS="ck-1,ck-2")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokenseam.cli",
            "gateway",
            "--upstream",
            fake.url,
            "--port",
            str(port),
            "--cache-store",
            f"sqlite:{db}",
            "--upstream-key-env",
            "TS_UP_KEY",
            "--api-key-env",
            "TS_CLIENT_KEYS",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert _wait_health(proc, url).status_code == 200
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "cli"}], "temperature": 0}
        a = httpx.post(
            url + "/v1/chat/completions", json=body, timeout=20, headers={"authorization": "Bearer ck-1"}
        )
        b = httpx.post(
            url + "/v1/chat/completions", json=body, timeout=20, headers={"authorization": "Bearer ck-1"}
        )
        assert (a.headers["x-tokenseam-cache"], b.headers["x-tokenseam-cache"]) == ("miss", "hit")
        assert a.json()["choices"] == b.json()["choices"]
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=20).status_code == 401
        metrics = httpx.get(url + "/metrics", timeout=5, headers={"authorization": "Bearer ck-2"})
        assert "tokenseam_respcache_requests_total" in metrics.text
        assert db.exists() and fake.state.calls == 1
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_gateway_process_never_prints_credentials(tmp_path):
    port, dead = free_port(), free_port()
    env = dict(os.environ, TS_UP_KEY="sk-up-s3cret")
    upstream = f"http://user:s3cret@127.0.0.1:{dead}/v1?api_key=s3cret"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokenseam.cli",
            "gateway",
            "--upstream",
            upstream,
            "--port",
            str(port),
            "--cache-store",
            "memory",
            "--upstream-key-env",
            "TS_UP_KEY",
            "--no-client-auth",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        health = _wait_health(proc, url)
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "temperature": 0},
            timeout=20,
        )
        assert r.status_code == 502
        for text in (health.text, r.text):
            assert "s3cret" not in text and "***" in text
    finally:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    output = (out + err).decode()
    assert "tokenseam gateway on" in output and f"user:***@127.0.0.1:{dead}?api_key=***" in output
    assert "client auth OFF" in output and "s3cret" not in output
