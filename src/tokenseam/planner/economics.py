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
* Hit probability 1 - q: with an idle timeout, the chance that a call comes within the TTL of the previous one.
* Caching as is vs not at all (explicit caches can be left without a breakpoint): caching pays iff
  c(p, q) < p, i.e. q * w + (1 - q) * r < 1 on the cached part. With w > 1 that needs q < (1 - r) / (w - r):
  Anthropic's 5-minute write (w = 1.25, r = 0.1) needs q < 0.7826, i.e. lam > 12 * ln(1 / 0.7826) = 2.94 calls/hour.
* Break-even prefix at a rate: a prefix p under the floor pays less padded to T iff T * (q w + (1 - q) r) < p. In
  steady state (q = 0) that is the floor(F * r) + 1 rule; a write premium raises it: at q = e^-1 (12 calls/hour
  on a 5-minute idle TTL) with F = 1,024, r = 0.1, w = 1.25 the prefix must exceed 535.6 tokens, with w = 1.0
  only 441.4.
* Approximate counts (no local tokenizer): with a relative error bound e the true length can be as low as
  p / (1 + e). The plan then counts the prefix as cached only if even that clears the floor, and plans the padded
  length against the raised floor ceil(F * (1 + e)), so the padded prefix clears the floor in the worst case.
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

    return None if t == p else _rate_break_even(gain, ttl_seconds)


def _rate_break_even(gain, ttl_seconds: float) -> float | None:
    """Smallest call rate where gain(rate) > 0, given gain grows with the rate: 0.0 if it is positive at any
    rate, None if never (not even in steady state). Bisection on log(rate)."""
    if gain(None) <= 0:
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


def caching_break_even_calls_per_hour(
    read: float, write: float, ttl_seconds: float, refresh_on_hit: bool = True
) -> float | None:
    """The call rate above which caching a prefix (paying writes on misses, reads on hits) beats not caching it
    at all. 0.0 when writes cost no more than a normal input token; None when reads cost as much as input."""
    if read >= 1.0:
        return None
    if write <= 1.0:
        return 0.0

    def gain(rate: float | None) -> float:
        q = miss_probability(rate, ttl_seconds, refresh_on_hit)
        return 1.0 - (q * write + (1.0 - q) * read)

    return _rate_break_even(gain, ttl_seconds)


def break_even_prefix_at(floor: int, block: int, read: float, write: float, miss: float) -> int:
    """The shortest prefix under the floor for which padding to the first cacheable length pays at miss
    probability `miss`: floor(T * (miss * write + (1 - miss) * read)) + 1 with T = the planned length of 1 token."""
    t = planned_length(1, floor, block)
    return math.floor(t * (miss * write + (1.0 - miss) * read)) + 1


def _cost(n: int, cached: int, read: float, write: float, miss: float) -> float:
    return miss * write * cached + (1.0 - miss) * read * cached + (n - cached)


@dataclass(frozen=True)
class OptionPlan:
    """Uncached, as-is and padded costs for one write option of a profile."""

    write_option: str
    write_multiplier: float
    ttl_seconds: float | None
    miss_probability: float
    hit_probability: float
    cost_uncached: float
    cost_as_is: float
    cost_planned: float
    caching_pays: bool
    padding_wins: bool
    verdict: str
    break_even_calls_per_hour: float | None
    caching_break_even_calls_per_hour: float | None
    break_even_prefix: int
    usd_per_call_as_is: float | None
    usd_per_call_planned: float | None
    usd_per_month_uncached: float | None
    usd_per_month_as_is: float | None
    usd_per_month_planned: float | None
    tokens_per_month_uncached: float | None
    tokens_per_month_as_is: float | None
    tokens_per_month_planned: float | None


@dataclass(frozen=True)
class Plan:
    """Everything `tokenseam plan` reports for one prefix and one profile."""

    prefix_tokens: int
    prefix_tokens_low: int
    count_exact: bool
    floor: int
    floor_effective: int
    block: int
    explicit: bool
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
    rel_error: float = 0.0,
    explicit: bool = False,
) -> Plan:
    """Plan for prefix length p. `writes` = (name, write multiplier, ttl seconds) per write option.

    `rel_error` is the count's relative error bound (0 for an exact count); `explicit` says the cache needs a
    breakpoint, so leaving the prefix uncached is a choice the verdict considers."""
    if p < 0:
        raise ValueError("prefix length must be >= 0")
    if not (math.isfinite(rel_error) and rel_error >= 0):
        raise ValueError("rel_error must be a finite number >= 0")
    p_low = math.ceil(p / (1.0 + rel_error)) if rel_error else p
    f_eff = math.ceil(floor * (1.0 + rel_error)) if rel_error else floor
    t = planned_length(p, f_eff, block)
    cached = cached_tokens(p, floor, block) if p_low >= floor else 0
    cached_t = cached_tokens(t, floor, block)
    monthly = None if calls_per_hour is None else calls_per_hour * HOURS_PER_MONTH

    def usd(x: float) -> float | None:
        return None if price_per_mtok is None else x * price_per_mtok / 1e6

    def per_month(x: float | None) -> float | None:
        return None if monthly is None or x is None else x * monthly

    options = []
    for name, w, ttl in writes:
        q = miss_probability(calls_per_hour, ttl, refresh_on_hit)
        a = _cost(p, cached, read, w, q)
        b = _cost(t, cached_t, read, w, q)
        choices = {"as is": a, "pad": b}
        if explicit:
            choices["no breakpoint"] = float(p)
        best = min(choices, key=lambda k: (choices[k], k != "as is"))
        verdict = {
            "as is": "cache as is" if cached else "leave as is (not cached)",
            "pad": f"pad to {t:,} and cache",
            "no breakpoint": "do not cache (no breakpoint)",
        }[best]

        def pad_gain(rate: float | None, w=w, ttl=ttl) -> float:
            qq = miss_probability(rate, ttl, refresh_on_hit)
            return _cost(p, cached, read, w, qq) - _cost(t, cached_t, read, w, qq)

        options.append(
            OptionPlan(
                write_option=name,
                write_multiplier=w,
                ttl_seconds=None if math.isinf(ttl) else ttl,
                miss_probability=q,
                hit_probability=1.0 - q,
                cost_uncached=float(p),
                cost_as_is=a,
                cost_planned=b,
                caching_pays=cached > 0 and a < p,
                padding_wins=b < a,
                verdict=verdict,
                break_even_calls_per_hour=None if t == p else _rate_break_even(pad_gain, ttl),
                caching_break_even_calls_per_hour=caching_break_even_calls_per_hour(
                    read, w, ttl, refresh_on_hit
                ),
                break_even_prefix=break_even_prefix_at(f_eff, block, read, w, q),
                usd_per_call_as_is=usd(a),
                usd_per_call_planned=usd(b),
                usd_per_month_uncached=per_month(usd(float(p))),
                usd_per_month_as_is=per_month(usd(a)),
                usd_per_month_planned=per_month(usd(b)),
                tokens_per_month_uncached=per_month(float(p)),
                tokens_per_month_as_is=per_month(a),
                tokens_per_month_planned=per_month(b),
            )
        )
    sa = _cost(p, cached, read, 1.0, 0.0)
    sb = _cost(t, cached_t, read, 1.0, 0.0)
    return Plan(
        prefix_tokens=p,
        prefix_tokens_low=p_low,
        count_exact=rel_error == 0,
        floor=floor,
        floor_effective=f_eff,
        block=block,
        explicit=explicit,
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
