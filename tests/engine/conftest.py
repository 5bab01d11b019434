"""Fixtures the engine tests share."""

from __future__ import annotations

import pytest

from tokenseam.engine import BackendConfig, Engine, LlamaCppBackend


@pytest.fixture(scope="module")
def engine(model_paths):
    """A small SmolLM2 engine: 4 slots of 256 tokens, 2 threads, no prefix cache (one per test module)."""
    be = LlamaCppBackend(
        model_paths["smollm2"], BackendConfig(n_ctx=256, n_seq=4, n_threads=2, prefix_cache_tokens=0)
    )
    eng = Engine(be)
    yield eng
    eng.shutdown()
    be.close()
