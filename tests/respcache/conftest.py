"""Fixtures for the response-cache tests: a real redis-server on a free loopback port, fresh metric registries."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

REDIS_SERVER = "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    if not os.path.exists(REDIS_SERVER) and not shutil.which("redis-server"):
        pytest.skip("redis-server is not installed at /usr/bin/redis-server; Redis store tests need a real server")
    exe = REDIS_SERVER if os.path.exists(REDIS_SERVER) else shutil.which("redis-server")
    port = free_port()
    d = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d), "--save", "",
                             "--appendonly", "no", "--protected-mode", "yes"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"redis-server did not start on port {port}")
            time.sleep(0.05)
    client.close()
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def registry():
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()
