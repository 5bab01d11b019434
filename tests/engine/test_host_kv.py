"""Cached prefixes kept as host blobs: what is restored decodes exactly like a cold prefill."""

from __future__ import annotations

import numpy as np
import pytest

from tokenseam.engine import BackendConfig, LlamaCppBackend
from tokenseam.engine.prefix_cache import HostKV, KVRestoreError, PrefixCache

pytestmark = pytest.mark.model


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def backend(request, model_paths):
    be = LlamaCppBackend(model_paths[request.param], BackendConfig(n_ctx=512, n_seq=2, n_threads=2))
    yield be
    be.close()


def _last_logits(be, seq, ids, cuts):
    """Decode ids in the chunks that `cuts` mark (llama.cpp's numerics depend on the batch shape)."""
    bounds = [0, *cuts, len(ids) - 1, len(ids)]
    out = None
    for a, b in zip(bounds, bounds[1:], strict=False):
        if b > a:
            out = be.decode([(seq, ids[a:b], a, True)])[0]
    return np.array(out)


def test_restored_prefix_gives_the_same_logits_as_a_cold_prefill(backend):
    ids = backend.tokenizer.encode("The capital of France is Paris. The capital of Italy is Rome. " * 6)[:96]
    assert 81 < len(ids) <= 96
    backend.clear()
    cold = _last_logits(backend, 0, ids, [80])  # the same chunks as the cached run below
    backend.clear()
    _last_logits(backend, 0, ids, [])
    kv = HostKV(backend, backend.n_seq_total)
    cache = PrefixCache(kv, [backend.n_seq_total, backend.n_seq_total + 1], max_tokens=1024, block_size=16)
    cache.insert(ids[:80], 0)
    assert len(kv.blobs) == 1 and kv.bytes_held > 0
    backend.clear()  # nothing of the prompt is left in the KV cache; the cache holds it in host memory
    assert backend.seq_len(0) == 0 and backend.seq_len(backend.scratch_seq) == 0
    n = cache.load(ids, 1, limit=len(ids) - 1)
    assert n == 80 and backend.seq_len(1) == 80  # the 80 tokens cached, of the 96 decoded
    warm = _warm(backend, ids, n)
    assert np.array_equal(cold, warm)


def _warm(be, ids, n):
    be.decode([(1, ids[n:-1], n, False)])
    return np.array(be.decode([(1, ids[-1:], len(ids) - 1, True)])[0])


def test_a_restore_llama_cpp_refuses_is_reported(backend):
    kv = HostKV(backend, backend.n_seq_total)
    kv.blobs[backend.n_seq_total] = bytearray(b"\x00garbage" * 4)
    with pytest.raises(KVRestoreError):
        kv.seq_cp(backend.n_seq_total, 0, 0, 16)
