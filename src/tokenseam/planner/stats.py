"""Paired statistics for A/B prompt evaluation: McNemar's test (exact and chi-square) and the paired-difference CI.

Pure standard library, so `tokenseam eval` needs no scipy; the tests check every figure against scipy/statsmodels.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

Z_975 = 1.959963984540054  # standard normal quantile for a two-sided 95 % interval


@dataclass(frozen=True)
class PairedSummary:
    """Outcomes of two variants on the same items.

    both_right / both_wrong are concordant pairs; a_only (A right, B wrong) and b_only (A wrong, B right) are the
    flips McNemar's test looks at. diff = accuracy(B) - accuracy(A).
    """

    n: int
    both_right: int
    both_wrong: int
    a_only: int
    b_only: int
    accuracy_a: float
    accuracy_b: float
    diff: float
    ci_low: float
    ci_high: float
    mcnemar_exact_p: float
    mcnemar_chi2: float
    mcnemar_chi2_p: float

    def to_dict(self) -> dict:
        return asdict(self)


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: 2 * P(X <= min(b, c)) for X ~ Binomial(b + c, 1/2), capped at 1."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2**n)  # exact integer arithmetic until the final division


def mcnemar_chi2(b: int, c: int) -> tuple[float, float]:
    """McNemar's chi-square with Edwards' continuity correction, max(0, |b - c| - 1)^2 / (b + c), and its p-value
    (chi-square, 1 degree of freedom: P = erfc(sqrt(x / 2)))."""
    n = b + c
    if n == 0:
        return 0.0, 1.0
    stat = max(0, abs(b - c) - 1) ** 2 / n
    return stat, math.erfc(math.sqrt(stat / 2))


def paired_diff_ci(b: int, c: int, n: int, z: float = Z_975) -> tuple[float, float, float]:
    """Wald interval for the paired accuracy difference p_B - p_A = (c - b) / n (Agresti, Categorical Data
    Analysis, 10.1): variance = ((b + c) / n - d^2) / n, i.e. the variance of the per-item differences in
    {-1, 0, +1} divided by n. Returns (d, low, high); with no discordant pairs the interval is [0, 0]."""
    if n <= 0:
        return 0.0, 0.0, 0.0
    d = (c - b) / n
    var = max(0.0, ((b + c) / n - d * d) / n)
    half = z * math.sqrt(var)
    return d, d - half, d + half


def paired_summary(a_correct: list[bool], b_correct: list[bool]) -> PairedSummary:
    """Summarise paired outcomes (same items, same order) of variant A and variant B."""
    if len(a_correct) != len(b_correct):
        raise ValueError("paired outcomes must have the same length")
    n = len(a_correct)
    rr = sum(1 for x, y in zip(a_correct, b_correct, strict=True) if x and y)
    ww = sum(1 for x, y in zip(a_correct, b_correct, strict=True) if not x and not y)
    a_only = sum(1 for x, y in zip(a_correct, b_correct, strict=True) if x and not y)
    b_only = n - rr - ww - a_only
    d, lo, hi = paired_diff_ci(a_only, b_only, n)
    stat, p_chi = mcnemar_chi2(a_only, b_only)
    return PairedSummary(
        n=n,
        both_right=rr,
        both_wrong=ww,
        a_only=a_only,
        b_only=b_only,
        accuracy_a=(rr + a_only) / n if n else 0.0,
        accuracy_b=(rr + b_only) / n if n else 0.0,
        diff=d,
        ci_low=lo,
        ci_high=hi,
        mcnemar_exact_p=mcnemar_exact_p(a_only, b_only),
        mcnemar_chi2=stat,
        mcnemar_chi2_p=p_chi,
    )
