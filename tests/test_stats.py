"""lnexp/stats.py is glue: each statistic equals the scipy/statsmodels call it wraps and the
textbook formula, on fixed tables."""

from __future__ import annotations

import math
import statistics

import pytest
from scipy import stats as ss

from lnexp import stats as S

Z = ss.norm.ppf(0.975)


@pytest.mark.parametrize("k,n", [(0, 4), (3, 5), (7, 10), (12, 12)])
def test_wilson_interval(k, n):
    centre = (k + Z * Z / 2) / (n + Z * Z)
    half = Z / (n + Z * Z) * math.sqrt(k * (n - k) / n + Z * Z / 4)
    ci = ss.binomtest(k, n).proportion_ci(method="wilson")
    assert S.wilson(k, n) == pytest.approx((centre - half, centre + half), abs=1e-12)
    assert S.wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert all(math.isnan(x) for x in S.wilson(0, 0))


def test_binomial_test_of_one_arm():
    assert S.share_p(8, 10) == pytest.approx((45 + 10 + 1) / 1024, abs=1e-15)  # P(X >= 8), X ~ B(10, 1/2)
    assert S.share_p(8, 10) == ss.binomtest(8, 10, 0.5, alternative="greater").pvalue
    assert S.share_p(1, 6, alternative="less") == pytest.approx(7 / 64, abs=1e-15)
    assert S.share_p(0, 0) == 1.0


@pytest.mark.parametrize("table", [(4, 4, 0, 4), (3, 3, 0, 5), (5, 6, 1, 6), (2, 4, 2, 4)])
def test_boschloo_exact_on_two_arms(table):
    k1, n1, k2, n2 = table
    m = [[k1, k2], [n1 - k1, n2 - k2]]  # columns are the arms, the first row the seeds that trained
    assert S.two_arm_p(*table) == pytest.approx(ss.boschloo_exact(m, alternative="greater").pvalue, abs=1e-12)
    assert S.two_arm_p(*table) <= ss.fisher_exact(m, alternative="greater")[1] + 1e-12  # never weaker
    assert S.two_arm_p(k2, n2, k1, n1, "less") == pytest.approx(S.two_arm_p(*table), abs=1e-9)
    assert S.two_arm_p(4, 4, 0, 4) == pytest.approx(2 ** -8)  # every seed against none: 1/256
    assert S.two_arm_p(0, 4, 4, 4) == 1.0 and S.two_arm_p(1, 1, 0, 0) == 1.0


def test_paired_t_tests_and_interval():
    d = [0.3, 0.5, 0.4, 0.6]
    n, m, sd = len(d), statistics.fmean(d), statistics.stdev(d)
    se = sd / math.sqrt(n)
    half = ss.t.ppf(0.975, n - 1) * se
    got = S.paired(d, delta=0.5)
    assert (got.n, got.mean) == (4, pytest.approx(0.45))
    assert (got.low, got.high) == pytest.approx((m - half, m + half), abs=1e-12)
    assert got.p_above == pytest.approx(ss.t.sf(m / se, n - 1), abs=1e-12)
    assert got.p_below == pytest.approx(ss.t.cdf((m - 0.5) / se, n - 1), abs=1e-12)
    assert got.p_above == pytest.approx(ss.ttest_1samp(d, 0, alternative="greater").pvalue)
    assert S.paired([0.2]).p_above == 1.0 and math.isnan(S.paired([0.2]).low)


def test_tost_is_statsmodels_and_the_larger_one_sided_p():
    from statsmodels.stats.weightstats import ttost_paired

    a, b = [7.02, 6.91, 7.10, 6.95], [6.98, 6.95, 7.04, 6.90]
    d = [x - y for x, y in zip(a, b, strict=True)]
    se = statistics.stdev(d) / math.sqrt(len(d))
    lower, upper = ss.t.sf((statistics.fmean(d) + 0.1) / se, 3), ss.t.cdf((statistics.fmean(d) - 0.1) / se, 3)
    p_in, p_out = S.tost(a, b, 0.1)
    assert p_in == pytest.approx(max(lower, upper), abs=1e-12)
    import numpy as np

    assert p_in == pytest.approx(ttost_paired(np.array(a), np.array(b), -0.1, 0.1)[0], abs=1e-12)
    assert p_out == pytest.approx(min(1.0, 2 * min(1 - upper, 1 - lower)), abs=1e-9)
    far_in, far_out = S.tost([9.0, 9.1, 9.05], [8.0, 8.02, 8.1], 0.1)  # a whole bit apart
    assert far_in > 0.9 and far_out < 0.01


def test_holm_step_down():
    from statsmodels.stats.multitest import multipletests

    ps = [0.01, 0.04, 0.03, 0.2]
    reject, adjusted = S.holm(ps)
    # sorted 0.01, 0.03, 0.04, 0.2 times 4, 3, 2, 1, made monotone: 0.04, 0.09, 0.09, 0.2
    assert adjusted == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert reject == [True, False, False, False]
    assert adjusted == pytest.approx(list(multipletests(ps, method="holm")[1]))


def test_levene_one_sided():
    a, b = [6.50, 6.52, 6.49, 6.51], [6.2, 6.9, 6.4, 7.1]
    p = ss.levene(a, b, center="mean").pvalue
    assert S.spread_p(a, b) == pytest.approx((p / 2, 1 - p / 2))
    assert S.spread_p(b, a) == pytest.approx((1 - p / 2, p / 2))
    assert S.spread_p([1.0], b) == (1.0, 1.0)


def test_sample_sizes_reach_the_power_and_one_fewer_does_not():
    from statsmodels.stats.power import TTestPower

    n = S.paired_n(0.585, 0.5, 0.05 / 12)
    power = TTestPower().power(effect_size=0.585 / 0.5, nobs=n, alpha=0.05 / 12, alternative="larger")
    less = TTestPower().power(effect_size=0.585 / 0.5, nobs=n - 1, alpha=0.05 / 12, alternative="larger")
    assert power >= S.POWER > less

    def exact(n: int, p1: float, p2: float | None, alpha: float) -> float:
        b = ss.binom
        if p2 is None:
            return sum(b.pmf(k, n, p1) for k in range(n + 1)
                       if ss.binomtest(k, n, 0.5, alternative="greater").pvalue < alpha)
        return sum(b.pmf(i, n, p1) * b.pmf(j, n, p2) for i in range(n + 1) for j in range(n + 1)
                   if ss.boschloo_exact([[i, j], [n - i, n - j]], alternative="greater").pvalue < alpha)

    for p2, alpha in ((None, 0.05), (0.05, 0.05 / 6)):
        n = S.share_n(0.95, p2, alpha)
        assert exact(n, 0.95, p2, alpha) >= S.POWER > exact(n - 1, 0.95, p2, alpha)
    n = S.spread_n(4.0, 0.05)
    f = ss.f
    assert f.sf(f.ppf(0.95, n - 1, n - 1) / 4, n - 1, n - 1) >= S.POWER
    assert f.sf(f.ppf(0.95, n - 2, n - 2) / 4, n - 2, n - 2) < S.POWER
