"""The gateway at scale with real processes: three tokenseam replicas (SmolLM2 through llama.cpp), two gateway
processes sharing one redis-server; a replica is killed and Redis restarted mid-load while clients stream
with token ids and some leave mid-stream. Nothing may come back as a 5xx (a healthy replica always
exists), no cache hit may be wrong, no stream's ids may fail to join, and every slot is freed."""

from __future__ import annotations

import shutil

import pytest

from tokenseam.bench.gateway import run_chaos

pytestmark = [pytest.mark.model, pytest.mark.server]


@pytest.mark.skipif(
    not shutil.which("redis-server") and not __import__("os").path.exists("/usr/bin/redis-server"),
    reason="redis-server is not installed",
)
def test_kill_a_replica_and_restart_redis_under_load():
    out = run_chaos("smollm2", replicas=3, clients=12, requests=240)
    assert out["five_xx"] == 0, out
    assert out["wrong_cache_hits"] == 0 and out["hits"] > 50, out
    assert out["streams_whose_ids_do_not_join"] == 0, out
    assert out["clients_that_left_mid_stream"] > 0 and out["in_flight_after"] == 0, out
    assert any("killed replica" in e for e in out["events"]) and any("Redis" in e for e in out["events"]), out
