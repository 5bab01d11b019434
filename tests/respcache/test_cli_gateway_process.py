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


def test_gateway_command_serves_from_sqlite(fake, tmp_path):
    port = free_port()
    db = tmp_path / "cli.sqlite"
    env = dict(os.environ, TS_UP_KEY="sk-up")
    proc = subprocess.Popen([sys.executable, "-m", "tokenseam.cli", "gateway", "--upstream", fake.url,
                             "--port", str(port), "--cache-store", f"sqlite:{db}", "--upstream-key-env", "TS_UP_KEY"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.1)
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "cli"}], "temperature": 0}
        a = httpx.post(url + "/v1/chat/completions", json=body, timeout=20)
        b = httpx.post(url + "/v1/chat/completions", json=body, timeout=20)
        assert (a.headers["x-tokenseam-cache"], b.headers["x-tokenseam-cache"]) == ("miss", "hit")
        assert a.json()["choices"] == b.json()["choices"]
        assert "tokenseam_respcache_requests_total" in httpx.get(url + "/metrics", timeout=5).text
        assert db.exists() and fake.state.calls == 1
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
