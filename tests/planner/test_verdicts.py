"""Verdicts per profile family on prompts of 60, 900, 1,500 and 3,000 tokens, pinned to hand arithmetic:
the 1024 x 0.1 = 102.4 break-even, the write premium's effect on it, hit probabilities, honest approximate
counts, and `pad` reaching the floor at the count's worst case."""

import json
import math
import subprocess
import sys

import pytest

from tokenseam.planner import economics as ec
from tokenseam.planner.cli_plan import plan_for
from tokenseam.planner.counting import APPROX_REL_ERROR, make_counter
from tokenseam.planner.pad import pad_prompt
from tokenseam.planner.profiles import load_profiles

SIZES = (60, 900, 1500, 3000)

# (profile, p) -> (verdict of the first write option in steady state, steady cost as is, steady cost planned)
# Each figure by hand: cost = r * cached + uncached remainder; planned length T = block * ceil(max(p, F) / block).
STEADY = {
    # OpenAI GPT-5 family: F 1024, 128-token blocks, r 0.1, implicit.
    ("openai-gpt-5", 60): ("leave as is (not cached)", 60, 102.4),  # 60 < 103: padding to 1024 costs more
    ("openai-gpt-5", 900): ("pad to 1,024 and cache", 900, 102.4),
    ("openai-gpt-5", 1500): ("pad to 1,536 and cache", 0.1 * 1408 + 92, 153.6),  # remainder 92 paid in full
    ("openai-gpt-5", 3000): ("pad to 3,072 and cache", 0.1 * 2944 + 56, 307.2),
    # GPT-5.6: F 1024, exact at the breakpoint, r 0.1, explicit (so "no breakpoint" is a choice too).
    ("openai-gpt-5.6", 60): ("leave as is (not cached)", 60, 102.4),
    ("openai-gpt-5.6", 900): ("pad to 1,024 and cache", 900, 102.4),
    ("openai-gpt-5.6", 1500): ("cache as is", 150, 150),
    ("openai-gpt-5.6", 3000): ("cache as is", 300, 300),
    # Anthropic 512 / 1024 / 4096 floors, r 0.1, exact.
    ("anthropic-512", 60): ("pad to 512 and cache", 60, 51.2),  # 51.2 < 60: pays from 52 tokens
    ("anthropic-512", 900): ("cache as is", 90, 90),
    ("anthropic-1024", 60): ("leave as is (not cached)", 60, 102.4),
    ("anthropic-1024", 900): ("pad to 1,024 and cache", 900, 102.4),
    ("anthropic-1024", 1500): ("cache as is", 150, 150),
    ("anthropic-4096", 1500): ("pad to 4,096 and cache", 1500, 409.6),
    ("anthropic-4096", 3000): ("pad to 4,096 and cache", 3000, 409.6),
    # Gemini implicit minimums 2,048 and 4,096, r 0.1.
    ("gemini-2.5", 60): ("leave as is (not cached)", 60, 204.8),
    ("gemini-2.5", 900): ("pad to 2,048 and cache", 900, 204.8),
    ("gemini-2.5", 1500): ("pad to 2,048 and cache", 1500, 204.8),
    ("gemini-2.5", 3000): ("cache as is", 300, 300),
    ("gemini-3", 900): ("pad to 4,096 and cache", 900, 409.6),
    ("gemini-3", 3000): ("pad to 4,096 and cache", 3000, 409.6),
    # DeepSeek prefix units: F 64, r 0.02.
    ("deepseek-flash", 60): ("pad to 64 and cache", 60, 64 * 0.02),
    ("deepseek-flash", 900): ("cache as is", 18, 18),
    ("deepseek-flash", 3000): ("cache as is", 60, 60),
    # tokenseam's prefix cache: 16-token blocks, reads free.
    ("local", 60): ("pad to 64 and cache", 12, 0),
    ("local", 900): ("pad to 912 and cache", 4, 0),
    ("local", 1500): ("pad to 1,504 and cache", 12, 0),
    ("local", 3000): ("pad to 3,008 and cache", 8, 0),
}


@pytest.mark.parametrize("profile, p", sorted(STEADY))
def test_steady_state_verdicts(profile, p):
    verdict, as_is, planned = STEADY[(profile, p)]
    plan = plan_for(load_profiles().get(profile), p, True, None, None)
    assert plan.steady_cost_as_is == pytest.approx(as_is)
    assert plan.steady_cost_planned == pytest.approx(planned)
    assert plan.options[0].verdict == verdict


def test_every_family_and_size_gets_a_verdict():
    ps = load_profiles()
    for name in ps.profiles:
        for p in SIZES:
            plan = plan_for(ps.get(name), p, True, 60.0, 1.0)
            for o in plan.options:
                best = min(o.cost_as_is, o.cost_planned, o.cost_uncached if plan.explicit else math.inf)
                chosen = {
                    "pad": o.cost_planned,
                    "cache as is": o.cost_as_is,
                    "leave as is (not cached)": o.cost_as_is,
                    "do not cache (no breakpoint)": o.cost_uncached,
                }
                key = "pad" if o.verdict.startswith("pad") else o.verdict
                assert chosen[key] == pytest.approx(best), (name, p, o)
                assert o.hit_probability == pytest.approx(1 - o.miss_probability)


def test_break_even_102_and_the_write_premium():
    # Steady state: padding a prefix under F = 1024 with r = 0.1 pays from floor(102.4) + 1 = 103 tokens.
    assert ec.break_even_prefix(1024, 0.1) == 103
    assert ec.break_even_prefix_at(1024, 1, 0.1, 1.25, 0.0) == 103
    # At 12 calls/hour on a 5-minute idle TTL a call misses with q = e^-1. Per cached token:
    # w = 1.25: 1.25 q + 0.1 (1 - q) = 0.52305 -> 1024 * 0.52305 = 535.6 -> pays from 536 tokens;
    # w = 1.0 (no premium): q + 0.1 (1 - q) = 0.43109 -> 441.4 -> from 442. The premium moves it by 94 tokens.
    q = math.exp(-1)
    assert ec.miss_probability(12, 300) == pytest.approx(q)
    assert (
        ec.break_even_prefix_at(1024, 1, 0.1, 1.25, q)
        == math.floor(1024 * (1.25 * q + 0.1 * (1 - q))) + 1
        == 536
    )
    assert ec.break_even_prefix_at(1024, 1, 0.1, 1.0, q) == math.floor(1024 * (q + 0.1 * (1 - q))) + 1 == 442
    plan = plan_for(load_profiles().get("anthropic-1024"), 500, True, 12.0, None)
    five = plan.options[0]
    assert five.write_option == "5m" and five.break_even_prefix == 536
    assert five.verdict == "leave as is (not cached)"  # 500 < 536: padding to 1024 costs 535.6 per call
    assert five.cost_planned == pytest.approx(1024 * (1.25 * q + 0.1 * (1 - q)))
    plan = plan_for(load_profiles().get("anthropic-1024"), 540, True, 12.0, None)
    assert plan.options[0].verdict == "pad to 1,024 and cache"


def test_caching_itself_can_lose_with_a_write_premium():
    # Caching as is beats no cache iff q w + (1 - q) r < 1  <=>  q < (1 - r) / (w - r).
    # Anthropic 5m: q* = 0.9 / 1.15 = 0.78261, lam* = 12 ln(1 / q*) = 2.9415 calls/hour.
    q_star = 0.9 / 1.15
    lam = ec.caching_break_even_calls_per_hour(0.1, 1.25, 300, True)
    assert lam == pytest.approx(-12 * math.log(q_star), rel=1e-9) and lam == pytest.approx(2.9415, abs=1e-4)
    # 1h at 2x: q* = 0.9 / 1.9, lam* = ln(1.9 / 0.9) = 0.7472 calls/hour.
    assert ec.caching_break_even_calls_per_hour(0.1, 2.0, 3600, True) == pytest.approx(math.log(1.9 / 0.9))
    # No premium: caching pays at any rate. GPT-5.6 counted from the write (30 min): q = 1 / (1 + lam / 2),
    # q* = 0.9 / 1.15 -> lam* = 2 (1 / q* - 1) = 0.5556 calls/hour.
    assert ec.caching_break_even_calls_per_hour(0.1, 1.0, 300, True) == 0.0
    assert ec.caching_break_even_calls_per_hour(0.1, 1.25, 1800, False) == pytest.approx(2 * (1.15 / 0.9 - 1))
    # At 1 call/hour a 1,500-token prefix on Anthropic's 5m write is cheaper without a breakpoint:
    # q = e^(-1/12) = 0.92004; cost = 1500 (1.25 q + 0.1 (1 - q)) = 1737.1 > 1500.
    plan = plan_for(load_profiles().get("anthropic-1024"), 1500, True, 1.0, None)
    five = plan.options[0]
    assert five.cost_as_is == pytest.approx(1500 * (1.25 * math.exp(-1 / 12) + 0.1 * (1 - math.exp(-1 / 12))))
    assert not five.caching_pays and five.verdict == "do not cache (no breakpoint)"
    assert five.hit_probability == pytest.approx(1 - math.exp(-1 / 12))
    # ... while an implicit cache has no breakpoint to leave out: GPT-5 at 1 call/hour, q = 0.92004:
    # as is 1408 (q + 0.1 (1 - q)) + 92 = 1398.7 beats padded 1536 (q + 0.1 (1 - q)) = 1425.4.
    plan = plan_for(load_profiles().get("openai-gpt-5"), 1500, True, 1.0, None)
    q = math.exp(-1 / 12)
    assert plan.options[0].cost_as_is == pytest.approx(1408 * (q + 0.1 * (1 - q)) + 92)
    assert plan.options[0].verdict == "cache as is"


def test_monthly_cost_three_ways():
    plan = plan_for(load_profiles().get("openai-gpt-5.6"), 900, True, 10.0, 2.0)
    o = plan.options[0]  # 30m, counted from the write: q = 1 / (1 + 10 * 0.5) = 1/6
    q = 1 / 6
    assert o.miss_probability == pytest.approx(q)
    assert o.cost_planned == pytest.approx(1024 * (1.25 * q + 0.1 * (1 - q)))
    assert o.usd_per_month_uncached == pytest.approx(900 * 2e-6 * 10 * 730)
    assert o.usd_per_month_planned == pytest.approx(o.cost_planned * 2e-6 * 7300)
    assert o.tokens_per_month_as_is == pytest.approx(900 * 7300)


def test_approximate_counts_plan_for_the_worst_case():
    prof = load_profiles().get("openai-gpt-5.6")
    # Exact 1,100 tokens: cached as is. Estimated 1,100 (+-25 %): could be 880 < 1024, so not counted as cached,
    # and the padded target is ceil(1024 * 1.25) = 1280, which clears 1024 even if the estimate is 25 % high.
    exact = plan_for(prof, 1100, True, None, None)
    assert exact.options[0].verdict == "cache as is" and exact.cached_as_is == 1100
    approx = plan_for(prof, 1100, False, None, None)
    assert approx.prefix_tokens_low == 880 and approx.cached_as_is == 0 and approx.floor_effective == 1280
    assert approx.planned_tokens == 1280 and approx.planned_tokens / (1 + APPROX_REL_ERROR) >= prof.floor
    assert approx.options[0].verdict == "pad to 1,280 and cache"
    # Estimated 1,300: even 1,040 clears the floor, so it is cached as is.
    assert plan_for(prof, 1300, False, None, None).options[0].verdict == "cache as is"
    with pytest.raises(ValueError):
        ec.make_plan(10, 5, 1, 0.1, [("w", 1.0, 60)], rel_error=math.nan)


def _examples(n, seed=5):
    import random

    rng = random.Random(seed)
    return [
        f"Q: What is {a} + {b}? Count the {rng.choice(['boxes', 'trains', 'rivers'])}.\nA: {a + b}."
        for a, b in ((rng.randint(10, 999), rng.randint(10, 999)) for _ in range(n))
    ]


@pytest.mark.parametrize(
    "profile", ["openai-gpt-5", "openai-gpt-5.6", "anthropic-512", "gemini-2.5", "deepseek-flash"]
)
@pytest.mark.parametrize("p", SIZES)
def test_pad_reaches_the_floor_at_the_worst_case(profile, p):
    """With bytes/4 counts, pad's padded prefix clears the floor even if the estimate is 25 % high."""
    prof = load_profiles().get(profile)
    counter = make_counter(None)
    prompt = ("abcd" * p)[:-1] + "."  # exactly p tokens by bytes/4
    assert counter.count(prompt) == p
    res = pad_prompt(prompt, _examples(900), prof, counter)
    r = res.report
    n = r["final_tokens"]
    f_eff = math.ceil(prof.floor * 1.25)
    assert r["effective_floor"] == f_eff and n == counter.count(res.text)
    if p >= f_eff and (prof.block == 1 or p % prof.block == 0):
        assert r["status"] == "already aligned: nothing appended" and n == p
    else:
        assert n >= f_eff and math.ceil(n / 1.25) >= prof.floor
        if prof.block > 1:
            assert n >= -(-max(p, f_eff) // prof.block) * prof.block


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "tokenseam.cli", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "model, p, verdict",
    [
        ("gpt-5.6", 1500, "cache as is"),  # could be 1,200 tokens: still over 1,024
        ("claude-opus-5", 900, "cache as is"),  # could be 720: over 512
        ("claude-opus-5", 60, "leave as is (not cached)"),  # padding must reach 640 (512 * 1.25): 64 > 60
        ("gemini-3-pro", 3000, "pad to 5,120 and cache"),
        ("gpt-5", 900, "pad to 1,280 and cache"),
    ],
)
def test_plan_cli_by_model_name_with_approximate_counts(tmp_path, model, p, verdict):
    f = tmp_path / "p.txt"
    f.write_text(("abcd" * p)[:-1] + ".")
    r = _cli("plan", str(f), "--profile", model, "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    assert plan["prefix_tokens"] == p and plan["count_exact"] is False
    assert plan["options"][0]["verdict"] == verdict, plan["options"][0]
