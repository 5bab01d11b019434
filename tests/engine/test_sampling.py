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


class _NumpyOnly(Sampler):
    """The sampler with its one-call picks (engine/draw.py) turned off: the numpy path, the reference."""

    def _pick_in_one_call(self, x, allowed):
        return -1


@pytest.mark.parametrize("greedy", [False, True])
def test_one_call_picks_are_the_numpy_paths(greedy):
    # Same seed, same tokens: the one-call draw takes the numpy path's steps and the same random number.
    rng = np.random.default_rng(11)
    n = 3000
    for case in range(40):
        logits = (rng.normal(0, rng.uniform(0.5, 8), n)).astype(np.float32)
        if case % 5 == 1:
            logits[rng.integers(0, n, 40)] = -np.inf  # tokens the model rules out
        if case % 5 == 2:
            logits[[5, 900]] = logits.max() + 3  # a tie at the top
        allowed = None
        if case % 3:
            allowed = rng.random(n) < (0.002 if case % 7 == 0 else 0.3)
        if case % 11 == 4:
            allowed = np.zeros(n, bool)
            allowed[[17, 18, 2999]] = True
            logits[[17, 18, 2999]] = -np.inf  # nothing allowed the model can say: the least bad allowed
        t = 0.0 if greedy else float(rng.choice([5e-324, 0.05, 0.7, 1.0, 3.0]))
        params = SamplingParams(temperature=t, seed=case)
        one, ref = Sampler(params, n), _NumpyOnly(params, n)
        got = [one.sample(logits, allowed)[0] for _ in range(30)]
        assert got == [ref.sample(logits, allowed)[0] for _ in range(30)], case
        if allowed is not None:
            assert all(allowed[tok] for tok in got)


def test_the_one_call_draw_leaves_the_cuts_to_numpy():
    # top-k, top-p and min-p cuts take the numpy path; a NaN logit is left out as numpy leaves it: same tokens.
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 4, 500).astype(np.float32)
    for kw in ({"top_k": 7}, {"top_p": 0.8}, {"min_p": 0.1}, {}):
        params = SamplingParams(temperature=0.9, seed=3, **kw)
        one, ref = Sampler(params, 500), _NumpyOnly(params, 500)
        assert [one.sample(logits, None)[0] for _ in range(20)] == [
            ref.sample(logits, None)[0] for _ in range(20)
        ]
    bad = logits.copy()
    bad[3] = np.nan
    one, ref = (
        Sampler(SamplingParams(temperature=0.9, seed=4), 500),
        _NumpyOnly(SamplingParams(temperature=0.9, seed=4), 500),
    )
    assert [one.sample(bad, None)[0] for _ in range(20)] == [ref.sample(bad, None)[0] for _ in range(20)]


def test_greedy_under_a_mask_with_no_finite_allowed_logit_takes_the_first_allowed():
    logits = np.zeros(8, np.float32)
    logits[[3, 5]] = [-np.inf, np.inf]
    allowed = np.zeros(8, bool)
    allowed[[3, 5]] = True
    params = SamplingParams(temperature=0, seed=1)
    assert (
        Sampler(params, 8).sample(logits, allowed)[0] == _NumpyOnly(params, 8).sample(logits, allowed)[0] == 3
    )
