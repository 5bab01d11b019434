"""Prompt-cache economics as pure functions: what a prefix of p tokens costs per call, as is and padded.

Costs are in full-price input-token equivalents (1.0 = one uncached input token); multiply by price/1e6 for money.

The model (all of it, so a reader can check every figure by hand):

* cached(p) = block * floor(p / block) when p >= floor, else 0. Only whole blocks are reused; the remainder
  p mod block is paid at full price on every call, and a prefix under the floor is never cached.
* A call that finds the entry warm pays read * cached(p); a call that finds it cold pays write * cached(p)
  (write = 1.0 for providers without a write surcharge). Either way it pays p - cached(p) in full.
* Calls arrive as a Poisson process at lam calls per hour. The probability q that a call finds the entry cold:
    - TTL restarted by every hit (idle timeout: Anthropic, OpenAI): a call is cold iff the gap since the
      previous call exceeds the TTL, so q = exp(-lam * ttl_hours).
    - TTL counted from the write: each write starts a window of ttl_hours holding lam * ttl_hours calls on
      average (all hits), then the next call is cold, so q = 1 / (1 + lam * ttl_hours).
    - no time limit (ttl = inf) or "steady state" (no rate given): q = 0. The very first write is ignored.
* Expected cost per call: c(n, q) = q * write * cached(n) + (1 - q) * read * cached(n) + (n - cached(n)).
* Planned length: T = block * ceil(max(p, floor) / block), the shortest prefix >= p that is fully cacheable.
  Padding wins iff c(T, q) < c(p, q). In steady state with p < floor that is read * T < p: the worked example
  (floor 1,024, read 0.1) gives 102.4 < p, so prefixes of 103..1,023 tokens pay less once padded.
* Per month = calls per hour * 730 (hours in an average month) * cost per call.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

HOURS_PER_MONTH = 730.0  # 365 * 24 / 12


def cached_tokens(n: int, floor: int, block: int) -> int:
    """Tokens of an n-token prefix the cache can serve: whole blocks, and nothing under the floor."""
    if n < 0 or floor < 0 or block < 1:
        raise ValueError("need n >= 0, floor >= 0, block >= 1")
    if n < floor:
        return 0
    return block * (n // block)


def planned_length(p: int, floor: int, block: int) -> int:
    """The shortest prefix length >= p that clears the floor and ends on a block boundary."""
    target = max(p, floor)
    return block * -(-target // block)


def miss_probability(calls_per_hour: float | None, ttl_seconds: float, refresh_on_hit: bool = True) -> float:
    """Probability that a call finds the cache entry expired (see the module docstring for the model)."""
    if calls_per_hour is None or math.isinf(ttl_seconds):
        return 0.0
    if calls_per_hour <= 0:
        return 1.0
    x = calls_per_hour * ttl_seconds / 3600.0
    return math.exp(-x) if refresh_on_hit else 1.0 / (1.0 + x)


def cost_per_call(
    n: int, floor: int, block: int, read: float, write: float = 1.0, miss: float = 0.0
) -> float:
    """Expected full-price-token equivalents paid per call for an n-token prefix (module docstring)."""
    c = cached_tokens(n, floor, block)
    return miss * write * c + (1.0 - miss) * read * c + (n - c)


def steady_state_padding_wins(p: int, floor: int, read: float) -> bool:
    """The issue's rule for a prefix under the floor: padding to F wins iff F * r < p (blocks and writes ignored)."""
    return p < floor and floor * read < p


def break_even_prefix(floor: int, read: float) -> int:
    """The shortest prefix for which padding to the floor pays in steady state: floor(F * r) + 1."""
    return math.floor(floor * read) + 1


def break_even_calls_per_hour(
    p: int, floor: int, block: int, read: float, write: float, ttl_seconds: float, refresh_on_hit: bool = True
) -> float | None:
    """The call rate above which padding p to the planned length pays, counting writes and expiry.

    0.0 if it pays at any rate, None if it never pays (not even in steady state). Found by bisection on
    log(rate); cost minus cost is monotone in the miss probability, which falls as the rate grows.
    """
    t = planned_length(p, floor, block)

    def gain(rate: float | None) -> float:
        q = miss_probability(rate, ttl_seconds, refresh_on_hit)
        return cost_per_call(p, floor, block, read, write, q) - cost_per_call(t, floor, block, read, write, q)

    if t == p or gain(None) <= 0:
        return None
    if math.isinf(ttl_seconds) or gain(1e-9) > 0:
        return 0.0
    lo, hi = 1e-9, 1.0
    while gain(hi) <= 0:
        hi *= 2.0
        if hi > 1e15:
            return None
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if gain(mid) > 0:
            hi = mid
        else:
            lo = mid
        if hi / lo < 1 + 1e-12:
            break
    return hi


@dataclass(frozen=True)
class OptionPlan:
    """As-is vs padded costs for one write option of a profile."""

    write_option: str
    write_multiplier: float
    ttl_seconds: float | None
    miss_probability: float
    cost_as_is: float
    cost_planned: float
    padding_wins: bool
    break_even_calls_per_hour: float | None
    usd_per_call_as_is: float | None
    usd_per_call_planned: float | None
    usd_per_month_as_is: float | None
    usd_per_month_planned: float | None
    tokens_per_month_as_is: float | None
    tokens_per_month_planned: float | None


@dataclass(frozen=True)
class Plan:
    """Everything `tokenseam plan` reports for one prefix and one profile."""

    prefix_tokens: int
    floor: int
    block: int
    read_multiplier: float
    planned_tokens: int
    padding_needed: int
    cached_as_is: int
    remainder_as_is: int
    steady_cost_as_is: float
    steady_cost_planned: float
    steady_padding_wins: bool
    break_even_prefix: int
    calls_per_hour: float | None
    price_per_mtok: float | None
    options: tuple[OptionPlan, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def make_plan(
    p: int,
    floor: int,
    block: int,
    read: float,
    writes: list[tuple[str, float, float]],
    refresh_on_hit: bool = True,
    calls_per_hour: float | None = None,
    price_per_mtok: float | None = None,
) -> Plan:
    """Plan for prefix length p. `writes` = (name, write multiplier, ttl seconds) per write option."""
    if p < 0:
        raise ValueError("prefix length must be >= 0")
    t = planned_length(p, floor, block)
    cached = cached_tokens(p, floor, block)
    options = []
    for name, w, ttl in writes:
        q = miss_probability(calls_per_hour, ttl, refresh_on_hit)
        a = cost_per_call(p, floor, block, read, w, q)
        b = cost_per_call(t, floor, block, read, w, q)
        monthly = None if calls_per_hour is None else calls_per_hour * HOURS_PER_MONTH
        ua = None if price_per_mtok is None else a * price_per_mtok / 1e6
        ub = None if price_per_mtok is None else b * price_per_mtok / 1e6
        options.append(
            OptionPlan(
                write_option=name,
                write_multiplier=w,
                ttl_seconds=None if math.isinf(ttl) else ttl,
                miss_probability=q,
                cost_as_is=a,
                cost_planned=b,
                padding_wins=b < a,
                break_even_calls_per_hour=break_even_calls_per_hour(
                    p, floor, block, read, w, ttl, refresh_on_hit
                ),
                usd_per_call_as_is=ua,
                usd_per_call_planned=ub,
                usd_per_month_as_is=None if monthly is None or ua is None else ua * monthly,
                usd_per_month_planned=None if monthly is None or ub is None else ub * monthly,
                tokens_per_month_as_is=None if monthly is None else a * monthly,
                tokens_per_month_planned=None if monthly is None else b * monthly,
            )
        )
    sa = cost_per_call(p, floor, block, read)
    sb = cost_per_call(t, floor, block, read)
    return Plan(
        prefix_tokens=p,
        floor=floor,
        block=block,
        read_multiplier=read,
        planned_tokens=t,
        padding_needed=t - p,
        cached_as_is=cached,
        remainder_as_is=p - cached,
        steady_cost_as_is=sa,
        steady_cost_planned=sb,
        steady_padding_wins=sb < sa,
        break_even_prefix=break_even_prefix(floor, read),
        calls_per_hour=calls_per_hour,
        price_per_mtok=price_per_mtok,
        options=tuple(options),
    )
