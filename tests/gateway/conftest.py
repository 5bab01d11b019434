"""Fixtures for the gateway tests: several fake replicas and gateways over them, all real HTTP servers."""

from __future__ import annotations

import pytest


@pytest.fixture
def replicas():
    """Three fake OpenAI servers (`tokenseam.testing.fake_upstream`), stopped at the end of the test."""
    from tokenseam.testing.fake_upstream import FakeUpstream

    fakes = [FakeUpstream().start() for _ in range(3)]
    yield fakes
    for f in fakes:
        try:
            f.stop()
        except Exception:
            pass


@pytest.fixture
def gateway():
    """Start gateways in-process over given upstreams; stopped at the end of the test."""
    from prometheus_client import CollectorRegistry

    from tokenseam.gateway import create_gateway_app
    from tokenseam.httpkit import BackgroundServer
    from tokenseam.respcache import MemoryStore, ResponseCache

    running = []

    def make(upstreams, *, store=None, mode="deterministic", **kw):
        reg = CollectorRegistry()
        cache = ResponseCache(store if store is not None else MemoryStore(), mode=mode, registry=reg)
        kw.setdefault("health_interval", 0.2)
        app = create_gateway_app(upstreams, cache=cache, registry=reg, **kw)
        srv = BackgroundServer(app).start()
        srv.cache, srv.registry, srv.pool = cache, reg, app.state.pool
        running.append(srv)
        return srv

    yield make
    for s in running:
        s.stop()
