"""McNemar (exact and chi-square) and the paired-difference CI against scipy/statsmodels on known 2x2 tables."""

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.contingency_tables import mcnemar

from tokenseam.planner.stats import mcnemar_chi2, mcnemar_exact_p, paired_diff_ci, paired_summary

# (both right, A only, B only, both wrong)
TABLES = [
    (50, 3, 12, 35),
    (40, 10, 10, 40),
    (0, 0, 5, 0),
    (100, 25, 5, 70),
    (10, 1, 0, 4),
    (300, 41, 63, 96),
    (7, 2, 9, 1),
    (0, 1, 1, 0),
]


def _outcomes(rr, a_only, b_only, ww):
    a = [True] * rr + [True] * a_only + [False] * b_only + [False] * ww
    b = [True] * rr + [False] * a_only + [True] * b_only + [False] * ww
    return a, b


@pytest.mark.parametrize("table", TABLES)
def test_mcnemar_exact_matches_statsmodels_and_scipy(table):
    rr, b, c, ww = table
    ref = mcnemar(np.array([[rr, b], [c, ww]]), exact=True).pvalue
    assert mcnemar_exact_p(b, c) == pytest.approx(ref, rel=1e-12, abs=1e-15)
    if b + c:
        assert mcnemar_exact_p(b, c) == pytest.approx(sps.binomtest(b, b + c, 0.5).pvalue, rel=1e-12)


@pytest.mark.parametrize("table", [t for t in TABLES if abs(t[1] - t[2]) >= 1])
def test_mcnemar_chi2_matches_statsmodels(table):
    rr, b, c, ww = table
    ref = mcnemar(np.array([[rr, b], [c, ww]]), exact=False, correction=True)
    stat, p = mcnemar_chi2(b, c)
    assert stat == pytest.approx(ref.statistic, rel=1e-12)
    assert p == pytest.approx(ref.pvalue, rel=1e-9)
    assert p == pytest.approx(sps.chi2.sf(stat, 1), rel=1e-9)


def test_mcnemar_chi2_balanced_flips():
    # |b - c| = 0: the corrected statistic is 0 (statsmodels' literal (|b-c|-1)^2 would give 1/(b+c)).
    assert mcnemar_chi2(10, 10) == (0.0, 1.0)
    assert mcnemar_chi2(0, 0) == (0.0, 1.0)
    assert mcnemar_exact_p(0, 0) == 1.0


@pytest.mark.parametrize("table", TABLES)
def test_paired_ci_matches_normal_interval_on_item_differences(table):
    rr, b, c, ww = table
    a_ok, b_ok = _outcomes(*table)
    d = np.array(b_ok, float) - np.array(a_ok, float)
    n = len(d)
    lo, hi = (
        sps.norm.interval(0.95, loc=d.mean(), scale=d.std(ddof=0) / np.sqrt(n))
        if d.std()
        else (d.mean(),) * 2
    )
    diff, got_lo, got_hi = paired_diff_ci(b, c, n)
    assert diff == pytest.approx(d.mean())
    assert (got_lo, got_hi) == pytest.approx((lo, hi), abs=1e-12)


def test_paired_ci_against_statsmodels_descrstats():
    # statsmodels' z-interval of the mean uses std / sqrt(n - 1); ours the Wald variance with 1/n.
    from statsmodels.stats.weightstats import DescrStatsW

    a_ok, b_ok = _outcomes(300, 41, 63, 96)
    d = np.array(b_ok, float) - np.array(a_ok, float)
    n = len(d)
    lo, hi = DescrStatsW(d).zconfint_mean(alpha=0.05)
    diff, got_lo, got_hi = paired_diff_ci(41, 63, n)
    scale = np.sqrt((n - 1) / n)
    assert got_hi - diff == pytest.approx((hi - d.mean()) * scale, rel=1e-10)
    assert got_lo - diff == pytest.approx((lo - d.mean()) * scale, rel=1e-10)


def test_paired_summary_counts():
    s = paired_summary(*_outcomes(50, 3, 12, 35))
    assert (s.n, s.both_right, s.a_only, s.b_only, s.both_wrong) == (100, 50, 3, 12, 35)
    assert s.accuracy_a == 0.53 and s.accuracy_b == 0.62 and s.diff == pytest.approx(0.09)
    assert s.ci_low < s.diff < s.ci_high
    with pytest.raises(ValueError):
        paired_summary([True], [])
