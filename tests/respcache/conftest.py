"""Fixtures for the response-cache tests: a real redis-server on a free loopback port, fresh metric registries."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

REDIS_SERVER = "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_redis(workdir, password: str | None = None) -> Iterator[int]:
    """A redis-server on a free loopback port (with `password` if given), ready when this yields its port."""
    exe = REDIS_SERVER if os.path.exists(REDIS_SERVER) else shutil.which("redis-server")
    if not exe:
        pytest.skip(
            "redis-server is not installed at /usr/bin/redis-server; Redis store tests need a real server"
        )
    port = free_port()
    auth = ["--requirepass", password] if password else []
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(workdir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
            *auth,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, password=password)
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
    try:
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    with running_redis(tmp_path_factory.mktemp("redis")) as port:
        yield f"redis://127.0.0.1:{port}/0"


@pytest.fixture
def registry():
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()


@pytest.fixture(scope="session")
def fake_upstream():
    from tokenseam.testing.fake_upstream import FakeUpstream

    with FakeUpstream() as f:
        yield f


@pytest.fixture
def fake(fake_upstream):
    fake_upstream.set_mode("ok")
    fake_upstream.state.latency = 0.0
    fake_upstream.state.token_delay = 0.0
    fake_upstream.reset()
    return fake_upstream


@pytest.fixture
def make_gateway():
    """Start gateways in-process (uvicorn on a free port); stopped at the end of the test."""
    from prometheus_client import CollectorRegistry

    from tokenseam.gateway import create_gateway_app
    from tokenseam.httpkit import BackgroundServer
    from tokenseam.respcache import MemoryStore, ResponseCache

    running = []

    def make(upstream_url, store=None, mode="deterministic", **kw):
        reg = CollectorRegistry()
        cache = ResponseCache(
            store if store is not None else MemoryStore(),
            mode=mode,
            registry=reg,
            store_retry_seconds=kw.pop("store_retry_seconds", 5.0),
        )
        # No health loop unless a test asks for one: its probes would show up in the upstream's logs.
        kw.setdefault("health_interval", 0)
        app = create_gateway_app(upstream_url, cache=cache, registry=reg, **kw)
        srv = BackgroundServer(app).start()
        srv.cache = cache
        srv.registry = reg
        running.append(srv)
        return srv

    yield make
    for s in running:
        s.stop()
