"""Cached prefixes kept as host blobs: what is restored decodes exactly like a cold prefill."""

from __future__ import annotations

import numpy as np
import pytest

from tokenseam.engine import BackendConfig, LlamaCppBackend
from tokenseam.engine.backend import BackendError
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
    cold = _cold(backend, ids)  # the same chunks as the cached run below
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


def _cold(be, ids):
    be.clear()
    out = _last_logits(be, 0, ids, [80])
    be.clear()
    return out


def test_a_copy_between_sequences_decodes_like_a_cold_prefill(backend):
    """Each sequence has a KV stream of its own: seq_cp copies the rows, and a save right after the copy (no
    decode between) already holds them."""
    ids = backend.tokenizer.encode("A slow river bends past the mill, and the mill wheel turns. " * 12)[:96]
    assert len(ids) == 96
    cold = _cold(backend, ids)
    _last_logits(backend, 0, ids, [])
    backend.seq_cp(0, 1, 0, 80)
    assert backend.seq_len(1) == 80 and backend.seq_len(0) == len(ids)  # the source keeps all of its KV
    blob = backend.save_prefix(1, 80)
    assert np.array_equal(cold, _warm(backend, ids, 80))
    backend.clear()
    backend.load_prefix(1, blob, 80)
    assert backend.seq_len(1) == 80
    assert np.array_equal(cold, _warm(backend, ids, 80))
    with pytest.raises(BackendError, match="from position 0"):
        backend.seq_cp(0, 1, 8, 80)


def test_one_sequence_is_copied_into_several_at_once(backend):
    """n > 1 choices: every other choice's sequence gets the prompt's KV from one save."""
    ids = backend.tokenizer.encode("A slow river bends past the mill, and the mill wheel turns. " * 12)[:96]
    cold = _cold(backend, ids)
    _last_logits(backend, 0, ids, [])
    backend.seq_cp(1, [1])  # a sequence copied onto itself is left alone
    backend.seq_cp(0, [1, backend.scratch_seq], 0, 80)
    assert [backend.seq_len(s) for s in (0, 1, backend.scratch_seq)] == [len(ids), 80, 80]
    assert np.array_equal(cold, _warm(backend, ids, 80))
    backend.clear()


def test_a_saved_prefix_shorter_than_its_sequence_is_cut_to_length(backend):
    ids = backend.tokenizer.encode("Seven lamps were lit along the harbour wall at dusk. " * 12)[:96]
    assert len(ids) == 96
    cold = _cold(backend, ids)
    _last_logits(backend, 0, ids, [])
    blob = backend.save_prefix(0, 80)  # through the scratch sequence, which is left empty
    assert backend.seq_len(0) == len(ids) and backend.seq_len(backend.scratch_seq) == 0
    whole = backend.save_prefix(0, len(ids))  # the sequence's own bytes
    assert len(blob) < len(whole)
    backend.clear()
    backend.load_prefix(1, blob, 80)
    assert backend.seq_len(1) == 80
    assert np.array_equal(cold, _warm(backend, ids, 80))


def test_a_decode_answers_items_in_their_order_whatever_their_sequences(backend):
    """The batch is written in order of sequence id (so llama.cpp computes neighbouring streams together);
    the results still come back in the order the items were given."""
    a = backend.tokenizer.encode("Paris is the capital of France, and Rome is the capital of")[:12]
    b = backend.tokenizer.encode("def add(x, y):\n    return x + y\n\nprint(add(2,")[:12]
    assert len(a) == len(b) == 12
    solo = {}
    for name, ids in (("a", a), ("b", b)):
        backend.clear()
        solo[name] = np.array(backend.decode([(0, ids, 0, True)])[0])
    backend.clear()
    assert backend.decode([(1, a, 0, True), (0, b, 0, False)])[1] is None
    backend.clear()
    ra, rb = backend.decode([(1, a, 0, True), (0, b, 0, True)])
    ra, rb = np.array(ra), np.array(rb)
    backend.clear()

    def cos(x, y):
        return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))

    assert cos(ra, solo["a"]) > 0.999 and cos(rb, solo["b"]) > 0.999
    assert cos(ra, solo["a"]) > cos(ra, solo["b"]) and cos(rb, solo["b"]) > cos(rb, solo["a"])


def test_each_item_gets_its_own_logits_rows(backend):
    """The batch is written in order of sequence, not of items: each item's logits must be the rows llama.cpp
    gives for its own tokens' batch positions, one per token for "all", none for an item that asks for none."""
    import llama_cpp

    a = backend.tokenizer.encode("Paris is the capital of France, and Rome is the capital of")[:3]
    b = backend.tokenizer.encode("def add(x, y):\n    return x + y\n\nprint(add(2,")[:4]
    assert len(a) == 3 and len(b) == 4

    def row(i):  # the row of batch position i, asked of llama.cpp itself
        return np.ctypeslib.as_array(
            llama_cpp.llama_get_logits_ith(backend._ctx, i), shape=(backend.n_vocab,)
        )

    backend.clear()
    # Written in order of sequence: b (sequence 0) at positions 0-3, then a (sequence 1) at 4-6.
    every, last = backend.decode([(1, a, 0, "all"), (0, b, 0, True)])
    assert len(every) == 3
    for got, i in zip(every, (4, 5, 6), strict=True):
        assert np.array_equal(got, row(i))
    assert np.array_equal(last, row(3))
    backend.clear()
    first, none = backend.decode([(1, a, 0, True), (0, b, 0, False)])
    assert none is None and np.array_equal(first, row(6))
    backend.clear()
    last_a, last_b = backend.decode([(1, a, 0, True), (0, b, 0, True)])
    assert np.array_equal(last_a, row(6)) and np.array_equal(last_b, row(3))
    backend.clear()
