"""Block-alignment solver: which whole examples to append so a prefix clears the floor and ends on a block boundary.

A subset-sum over token counts (bitset dynamic programme), ranked by the steady-state cost of the resulting length.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from .economics import cached_tokens, planned_length
from .errors import PlannerError

MAX_DP_BITS = 1 << 22  # sums tracked per item; 4 Mbit x items would be too slow, so the caller caps items too


@dataclass(frozen=True)
class Candidate:
    """A predicted padded length and the example indices (in file order) that give it."""

    total: int
    indices: tuple[int, ...]
    cost: float


def length_cost(n: int, floor: int, block: int, read: float) -> float:
    """Steady-state cost of an n-token prefix: read * cached + the uncached remainder (economics module)."""
    c = cached_tokens(n, floor, block)
    return read * c + (n - c)


def rank_key(n: int, floor: int, block: int, read: float) -> tuple[float, int]:
    """Candidates are ranked by steady cost, then by length: an exact boundary beats any overshoot past it."""
    return (length_cost(n, floor, block, read), n)


def candidates(weights: list[int], base: int, floor: int, block: int, read: float) -> Iterator[Candidate]:
    """Padded lengths reachable by appending a subset of items of `weights` tokens to a `base`-token prefix.

    Yields every reachable length >= the planned length (floor and first boundary) that could still be optimal,
    best first by steady cost then length: an exact boundary at the planned length, then the shortest
    overshoots, with later boundaries where they cost less than the overshoot. Raises PlannerError when the
    examples together cannot reach the floor-and-boundary target.
    """
    if any(w <= 0 for w in weights):
        raise PlannerError("every example must add at least one token")
    target = planned_length(base, floor, block)
    need = target - base
    if need <= 0:
        return
    total = sum(weights)
    if total < need:
        raise PlannerError(
            f"the examples add at most {total:,} tokens but the prefix needs {need:,} more "
            f"({base:,} -> {target:,}): add more examples; tokenseam never pads with filler"
        )
    # The least overshoot past `need` is below need + max(w) (add items until the sum crosses it), costing at most
    # read * target + max(w). A later boundary B costs read * B, so it can only win while read * (B - target) <
    # max(w); with read = 0 every boundary costs nothing and the nearest reachable one wins, wherever it is.
    reach_extra = total if read <= 0 else math.ceil(max(weights) / read)
    limit = min(total, need + max(weights) + reach_extra)
    mask = (1 << (limit + 1)) - 1
    reach = [1]  # reach[i]: bit s set iff some subset of the first i items sums to s
    for w in weights:
        reach.append((reach[-1] | (reach[-1] << w)) & mask)
    final = reach[-1]
    sums = [s for s in range(need, limit + 1) if (final >> s) & 1]
    sums.sort(key=lambda s: rank_key(base + s, floor, block, read))
    for s in sums:
        yield Candidate(base + s, _reconstruct(reach, weights, s), length_cost(base + s, floor, block, read))


def _reconstruct(reach: list[int], weights: list[int], s: int) -> tuple[int, ...]:
    chosen = []
    for i in range(len(weights), 0, -1):
        if (reach[i - 1] >> s) & 1:
            continue  # reachable without item i-1: leave it out (earlier examples are preferred)
        chosen.append(i - 1)
        s -= weights[i - 1]
    assert s == 0
    return tuple(reversed(chosen))
