"""The sampler at the edges of its parameters: never NaN, never a token outside what is allowed."""

from __future__ import annotations

import numpy as np
import pytest

from tokenseam.engine.sampling import Sampler, SamplingParams


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-8, 2.0, 100.0])
@pytest.mark.parametrize("top_p,top_k,min_p", [(1.0, 0, 0.0), (0.9, 0, 0.0), (1.0, 5, 0.0), (1.0, 0, 0.5)])
def test_tiny_and_large_temperatures_sample_a_real_token(temperature, top_p, top_k, min_p):
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 5, 1000).astype(np.float32)
    logits[[7, 8]] = 40.0  # a tie at the top: a tiny temperature must pick one of them, not produce NaN
    s = Sampler(SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=1), 1000)
    for _ in range(20):
        tok, _ = s.sample(logits, None)
        assert 0 <= tok < 1000
        if temperature < 1e-6:
            assert tok in (7, 8)


def test_tiny_temperature_under_a_mask_stays_in_the_mask():
    logits = np.linspace(-3, 3, 64).astype(np.float32)
    allowed = np.zeros(64, dtype=bool)
    allowed[[3, 10]] = True
    s = Sampler(SamplingParams(temperature=5e-324, seed=3), 64)
    assert {s.sample(logits, allowed)[0] for _ in range(10)} == {10}
