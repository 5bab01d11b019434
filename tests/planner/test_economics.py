"""Cache economics against hand-computed cases: the issue's worked example, write-cost break-even, TTL expiry."""

import math

import pytest

from tokenseam.planner import economics as ec


def test_worked_example_floor_1024_read_01():
    # F * r = 102.4: prefixes of 103..1023 tokens pay less once padded to the floor; 102 and 1024 do not.
    wins = [p for p in range(0, 2000) if ec.steady_state_padding_wins(p, 1024, 0.1)]
    assert wins[0] == 103 and wins[-1] == 1023 and len(wins) == 1023 - 103 + 1
    assert ec.break_even_prefix(1024, 0.1) == 103
    # The same answer from the general cost model (block 1, no write surcharge, steady state).
    for p in (102, 103, 900, 1023):
        plan = ec.make_plan(p, 1024, 1, 0.1, [("w", 1.0, 300)])
        assert plan.steady_padding_wins == (p >= 103)
        assert plan.steady_cost_planned == pytest.approx(102.4)
        assert plan.steady_cost_as_is == p
    # "a 900-token prompt pays almost 9x too much"
    assert 900 / 102.4 == pytest.approx(8.79, abs=0.01)


def test_block_remainder_paid_every_call():
    # OpenAI-like: floor 1024, 128-token blocks, read 0.5. p = 1100: 1024 cached, 76 paid in full.
    plan = ec.make_plan(1100, 1024, 128, 0.5, [("auto", 1.0, 300)])
    assert plan.cached_as_is == 1024 and plan.remainder_as_is == 76
    assert plan.steady_cost_as_is == pytest.approx(0.5 * 1024 + 76)  # 588
    assert plan.planned_tokens == 1152 and plan.padding_needed == 52
    assert plan.steady_cost_planned == pytest.approx(0.5 * 1152)  # 576 < 588
    assert plan.steady_padding_wins
    # Remainder 60 with read 0.5: padding 68 more tokens costs 64 cached-equivalents > 60, so it loses.
    plan = ec.make_plan(1084, 1024, 128, 0.5, [("auto", 1.0, 300)])
    assert plan.steady_cost_as_is == pytest.approx(572) and plan.steady_cost_planned == pytest.approx(576)
    assert not plan.steady_padding_wins


def test_cached_tokens_floor_and_blocks():
    assert ec.cached_tokens(1023, 1024, 128) == 0
    assert ec.cached_tokens(1024, 1024, 128) == 1024
    assert ec.cached_tokens(1279, 1024, 128) == 1152
    assert ec.cached_tokens(37, 0, 16) == 32
    assert ec.planned_length(37, 0, 16) == 48
    assert ec.planned_length(500, 1024, 128) == 1024
    assert ec.planned_length(1024, 1024, 128) == 1024
    with pytest.raises(ValueError):
        ec.cached_tokens(5, 0, 0)


def test_ttl_expiry_miss_probability():
    # Idle-timeout TTL of 5 min at 12 calls/hour: one call per 5 min on average, q = e^-1.
    assert ec.miss_probability(12, 300, True) == pytest.approx(math.exp(-1))
    # TTL from the write: 1 write per (1 + 1) calls.
    assert ec.miss_probability(12, 300, False) == pytest.approx(0.5)
    assert ec.miss_probability(None, 300) == 0.0
    assert ec.miss_probability(5, math.inf) == 0.0
    assert ec.miss_probability(0, 300) == 1.0


def test_write_cost_break_even_anthropic_5m():
    # p = 500 padded to F = 1024, write 1.25, read 0.1, 5-min idle TTL.
    # Padded cost 1024 * (0.1 + 1.15 q) < 500  <=>  q < (500/1024 - 0.1) / 1.15 = 0.337636
    # q = exp(-lam / 12)  =>  lam > -12 ln(0.337636) = 13.0294 calls/hour.
    q_star = (500 / 1024 - 0.1) / 1.15
    lam_star = -12 * math.log(q_star)
    assert lam_star == pytest.approx(13.0294, abs=1e-3)
    got = ec.break_even_calls_per_hour(500, 1024, 1, 0.1, 1.25, 300, True)
    assert got == pytest.approx(lam_star, rel=1e-9)
    below = ec.make_plan(500, 1024, 1, 0.1, [("5m", 1.25, 300)], calls_per_hour=13.0)
    above = ec.make_plan(500, 1024, 1, 0.1, [("5m", 1.25, 300)], calls_per_hour=13.1)
    assert not below.options[0].padding_wins and above.options[0].padding_wins
    # At 13 calls/hour: q = e^(-13/12) = 0.338465, padded = 1024 * (0.1 + 1.15 q) = 500.98 > 500.
    assert below.options[0].cost_planned == pytest.approx(1024 * (0.1 + 1.15 * math.exp(-13 / 12)))
    assert below.options[0].cost_as_is == 500


def test_write_cost_break_even_anthropic_1h():
    # 1-hour write at 2x: 1024 (0.1 + 1.9 q) < 500 <=> q < 0.204359, q = exp(-lam) => lam > 1.58788.
    q_star = (500 / 1024 - 0.1) / 1.9
    got = ec.break_even_calls_per_hour(500, 1024, 1, 0.1, 2.0, 3600, True)
    assert got == pytest.approx(-math.log(q_star), rel=1e-9)
    assert got == pytest.approx(1.58788, abs=1e-4)


def test_break_even_edge_cases():
    # Never pays: 100 tokens under a 1024 floor at read 0.1 (102.4 > 100) whatever the rate.
    assert ec.break_even_calls_per_hour(100, 1024, 1, 0.1, 1.25, 300) is None
    # Already on a boundary above the floor: nothing to pad.
    assert ec.break_even_calls_per_hour(1024, 1024, 128, 0.1, 1.0, 300) is None
    # No write surcharge and no expiry: pays at any rate.
    assert ec.break_even_calls_per_hour(40, 0, 16, 0.0, 1.0, math.inf) == 0.0


def test_monthly_figures():
    plan = ec.make_plan(900, 1024, 128, 0.1, [("auto", 1.0, 300)], calls_per_hour=100, price_per_mtok=2.5)
    o = plan.options[0]
    q = math.exp(-100 / 12)
    assert o.miss_probability == pytest.approx(q)
    assert o.cost_as_is == 900
    assert o.cost_planned == pytest.approx(1024 * (q + (1 - q) * 0.1))
    assert o.usd_per_call_as_is == pytest.approx(900 * 2.5e-6)
    assert o.usd_per_month_as_is == pytest.approx(900 * 2.5e-6 * 100 * 730)
    assert o.tokens_per_month_planned == pytest.approx(o.cost_planned * 73000)
