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


def _greedy(params: SamplingParams, logits, prompt=()):
    s = Sampler(params, len(logits), prompt_ids=list(prompt))
    return s, s.sample(np.asarray(logits, dtype=np.float32), None)[0]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    logits = [5.0, 4.0, -1.0, -1.5]
    assert _greedy(SamplingParams(temperature=0), logits, [0])[1] == 0
    # token 0 seen in the prompt: 5 / 2 = 2.5 < 4
    assert _greedy(SamplingParams(temperature=0, repetition_penalty=2.0), logits, [0])[1] == 1
    # a negative logit is multiplied: token 2 (-1 * 2 = -2) falls below token 3 (-1.5)
    assert _greedy(SamplingParams(temperature=0), [-9.0, -9.0, -1.0, -1.5], [2])[1] == 2
    assert (
        _greedy(SamplingParams(temperature=0, repetition_penalty=2.0), [-9.0, -9.0, -1.0, -1.5], [2])[1] == 3
    )


def test_repetition_penalty_window_and_generated_tokens():
    logits = np.array([5.0, 4.0, 3.0], dtype=np.float32)
    # only the last token of the prompt is in a window of 1: token 0, further back, is not penalized
    _, tok = _greedy(SamplingParams(temperature=0, repetition_penalty=4.0, repeat_last_n=1), logits, [0, 1])
    assert tok == 0
    # all of them (-1): 0 and 1 are penalized, 2 wins
    _, tok = _greedy(SamplingParams(temperature=0, repetition_penalty=4.0, repeat_last_n=-1), logits, [0, 1])
    assert tok == 2
    # a generated token counts too
    s = Sampler(SamplingParams(temperature=0, repetition_penalty=4.0), 3, prompt_ids=[])
    assert [s.sample(logits, None)[0] for _ in range(3)] == [0, 1, 2]


def test_min_keep_keeps_candidates_through_top_p():
    logits = np.array([10.0, 2.0, 1.9, 1.8, -5.0], dtype=np.float32)
    narrow = Sampler(SamplingParams(temperature=1.0, top_p=0.1, seed=1), 5)
    assert {narrow.sample(logits, None)[0] for _ in range(50)} == {0}
    wide = Sampler(SamplingParams(temperature=50.0, top_p=0.1, min_keep=3, seed=1), 5)
    assert {wide.sample(logits, None)[0] for _ in range(300)} == {0, 1, 2}


def test_the_sampler_order_decides_what_the_temperature_sees():
    logits = np.array([3.0, 2.0, 1.0, 0.0], dtype=np.float32)
    # llama-server: top_p at temperature 1 keeps the first two, then a high temperature spreads over them
    llama = Sampler(
        SamplingParams(
            temperature=100.0, top_p=0.8, samplers=("top_k", "top_p", "min_p", "temperature"), seed=2
        ),
        4,
    )
    assert {llama.sample(logits, None)[0] for _ in range(200)} == {0, 1}
    # OpenAI/vLLM: the temperature first flattens everything, top_p then keeps most of it
    openai_ = Sampler(SamplingParams(temperature=100.0, top_p=0.8, seed=2), 4)
    assert len({openai_.sample(logits, None)[0] for _ in range(200)}) >= 3


@pytest.mark.parametrize(
    "kw,param",
    [
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repeat_last_n": -2}, "repeat_last_n"),
        ({"min_tokens": 5, "max_tokens": 3}, "min_tokens"),
        ({"min_keep": -1}, "min_keep"),
        ({"samplers": ("top_k", "dry")}, "samplers"),
    ],
)
def test_bad_new_parameters(kw, param):
    from tokenseam.engine.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as ei:
        SamplingParams(**kw).validate(100)
    assert ei.value.param == param
