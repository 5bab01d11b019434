"""llama.cpp's flash attention: the "auto" choice, a bad setting, and that both kernels compute the same model."""

from __future__ import annotations

import numpy as np
import pytest

from tokenseam.engine import BackendConfig, LlamaCppBackend
from tokenseam.engine.backend import BackendError


@pytest.mark.parametrize(
    "setting,n_swa,expected",
    [
        ("auto", 0, False),  # full attention: every cell of the sequence's own stream is read
        ("auto", 512, True),  # cells outside the sliding window are masked: the kernel that skips them wins
        ("on", 0, True),
        ("off", 512, False),
    ],
)
def test_auto_turns_flash_attention_on_only_for_sliding_window_layers(setting, n_swa, expected):
    assert LlamaCppBackend.flash_attention_for(setting, n_swa) is expected


@pytest.mark.parametrize("setting", ["", "ON", "true", "1", None, "auto "])
def test_a_bad_setting_is_refused_before_the_model_loads(setting):
    with pytest.raises(BackendError, match="flash_attn must be one of auto, on, off"):
        LlamaCppBackend("/nonexistent.gguf", BackendConfig(flash_attn=setting))


@pytest.mark.model
@pytest.mark.parametrize(
    "model,n_seq,expected", [("smollm2", 1, False), ("smollm2", 2, False), ("gemma3", 1, True)]
)
def test_auto_reads_the_models_attention(model_paths, model, n_seq, expected):
    be = LlamaCppBackend(
        model_paths[model], BackendConfig(n_ctx=128, n_seq=n_seq, n_threads=2, prefix_cache_tokens=0)
    )
    try:
        assert be.flash_attn is expected
    finally:
        be.close()


@pytest.mark.model
def test_both_kernels_give_the_same_next_token_distribution(model_paths):
    """The same prompt, read in two batches so the second reads the first's KV, in a context with flash
    attention and one without: the logits agree to float16 rounding."""
    out = {}
    for fa in ("on", "off"):
        be = LlamaCppBackend(
            model_paths["smollm2"],
            BackendConfig(n_ctx=512, n_seq=1, n_threads=2, prefix_cache_tokens=0, flash_attn=fa),
        )
        try:
            assert be.flash_attn is (fa == "on")
            ids = be.tokenizer.encode("The capital of France is Paris. The capital of Italy is Rome. " * 8)
            be.decode([(0, ids[:-5], 0, False)])
            out[fa] = np.array(be.decode([(0, ids[-5:], len(ids) - 5, True)])[0], dtype=np.float64)
        finally:
            be.close()
    a, b = out["on"], out["off"]
    cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    assert cosine > 0.999, cosine
    assert np.max(np.abs(a - b)) < 0.05 * (a.max() - a.min()), np.max(np.abs(a - b))
    assert set(np.argsort(a)[-3:]) & set(np.argsort(b)[-3:])
