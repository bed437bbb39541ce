"""Seed statistics: glue around scipy and statsmodels, so that every figure and the atlas's claims
compute an interval, a test or a sample size the same way (tests/test_stats.py checks each against
the library call and a formula on fixed tables).

- :func:`summarise`: the mean of runs that differ only by seed, with its 95% t-interval (a
  t-interval rather than a bootstrap: with 2-5 seeds a bootstrap's percentiles are too narrow);
- :func:`wilson`, :func:`share_p`, :func:`two_arm_p`: how often a cell trained (counts of seeds),
  one arm against a share, two arms by Boschloo's exact test;
- :func:`paired`, :func:`tost`: differences paired by seed, one-sided t-tests and TOST;
- :func:`holm`: Holm's step-down adjustment across claims;
- :func:`paired_n`, :func:`share_n`: seeds per arm for a stated effect at a given power;
- :func:`lr_sensitivity`: Wortsman et al.'s learning-rate sensitivity of one arm and seed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache

LEVEL = 0.95
POWER = 0.8  # the power a claim's planned sample size aims at
MAX_N = 50  # share_n / paired_n search no further (a claim needing more says "more than 50")


@dataclass(frozen=True)
class SeedSummary:
    """mean, sample std, n and the two ends of the 95% t-interval of the mean (nan for n < 2)."""

    mean: float
    std: float
    n: int
    low: float
    high: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def text(self, nd: int = 2) -> str:
        if self.n == 0:
            return "-"
        if self.n == 1:
            return f"{self.mean:.{nd}f} (n=1)"
        return f"{self.mean:.{nd}f} ± {self.half_width:.{nd}f} (n={self.n})"


def finite(values: list[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def summarise(values: list[float]) -> SeedSummary:
    """The finite values' summary; the interval is mean ± t(0.975, n-1) · std / √n."""
    xs = finite(values)
    n = len(xs)
    if n == 0:
        return SeedSummary(math.nan, math.nan, 0, math.nan, math.nan)
    mean = statistics.fmean(xs)
    if n == 1:
        return SeedSummary(mean, math.nan, 1, math.nan, math.nan)
    from scipy.stats import t

    std = statistics.stdev(xs)
    half = float(t.ppf(0.5 + LEVEL / 2, n - 1)) * std / math.sqrt(n)
    return SeedSummary(mean, std, n, mean - half, mean + half)


# --- counts of seeds that trained -----------------------------------------------------------------


def wilson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of the share k/n (nan, nan for n = 0)."""
    if n == 0:
        return math.nan, math.nan
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)


@lru_cache(maxsize=4096)
def share_p(k: int, n: int, p0: float = 0.5, alternative: str = "greater") -> float:
    """Exact binomial test of k of n against the share p0 (1.0 for n = 0)."""
    if n == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(k, n, p0, alternative=alternative).pvalue)


@lru_cache(maxsize=4096)
def two_arm_p(k1: int, n1: int, k2: int, n2: int, alternative: str = "greater") -> float:
    """Boschloo's exact test that arm 1's share k1/n1 is greater (or less) than arm 2's, k2/n2
    (1.0 when an arm has no run; scipy's nan for a table without information is 1.0 too)."""
    if n1 == 0 or n2 == 0:
        return 1.0
    from scipy.stats import boschloo_exact

    p = float(boschloo_exact([[k1, k2], [n1 - k1, n2 - k2]], alternative=alternative).pvalue)
    return 1.0 if math.isnan(p) else min(p, 1.0)


# --- differences paired by seed -------------------------------------------------------------------


@dataclass(frozen=True)
class Paired:
    """Differences paired by seed: n, mean, the 95% t-interval, and the one-sided p-values that the
    mean is above 0 (``p_above``) and below ``delta`` (``p_below``)."""

    n: int
    mean: float
    low: float
    high: float
    p_above: float
    p_below: float


def paired(diffs: list[float], delta: float = 0.0) -> Paired:
    """One-sample t-tests of paired differences (scipy.stats.ttest_1samp); nan/1.0 for n < 2."""
    d = finite(diffs)
    if len(d) < 2:
        return Paired(len(d), d[0] if d else math.nan, math.nan, math.nan, 1.0, 1.0)
    from scipy.stats import ttest_1samp

    if statistics.pstdev(d) == 0:  # no spread: the t statistic is undefined, the sign is not
        m = d[0]
        return Paired(len(d), m, m, m, 0.0 if m > 0 else 1.0, 0.0 if m < delta else 1.0)
    ci = ttest_1samp(d, 0.0).confidence_interval(LEVEL)  # two-sided
    above = ttest_1samp(d, 0.0, alternative="greater").pvalue
    below = ttest_1samp(d, delta, alternative="less").pvalue
    return Paired(len(d), statistics.fmean(d), float(ci.low), float(ci.high), float(above), float(below))


def tost(a: list[float], b: list[float], margin: float) -> tuple[float, float]:
    """(p that |mean(a - b)| < margin, p that it lies outside): statsmodels' paired TOST, and the
    smaller of the two one-sided tests beyond the margin, doubled (Bonferroni). 1.0 for n < 2."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if math.isfinite(x) and math.isfinite(y)]
    if len(pairs) < 2:
        return 1.0, 1.0
    import numpy as np
    from statsmodels.stats.weightstats import ttost_paired

    x, y = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    d = x - y
    if float(np.std(d)) == 0:
        inside = abs(float(d[0])) < margin
        return (0.0, 1.0) if inside else (1.0, 0.0)
    p_in = float(ttost_paired(x, y, -margin, margin)[0])
    out = paired(list(d - margin))  # above +margin
    low = paired(list(-d - margin))  # below -margin
    return p_in, min(1.0, 2 * min(out.p_above, low.p_above))


def spread_p(a: list[float], b: list[float]) -> tuple[float, float]:
    """(p that a's spread over seeds is smaller than b's, p that it is larger): Levene's test
    (scipy.stats.levene, centred on the mean), halved in the direction the variances point.
    1.0 for fewer than 3 values in an arm (with 2, both deviations from the mean are equal: the
    test has no within-arm spread to compare against)."""
    a, b = finite(a), finite(b)
    if len(a) < 3 or len(b) < 3:
        return 1.0, 1.0
    import numpy as np
    from scipy.stats import levene

    with np.errstate(divide="ignore", invalid="ignore"):
        res = levene(a, b, center="mean")
    if not (math.isfinite(float(res.statistic)) and math.isfinite(float(res.pvalue))):
        return 1.0, 1.0  # no spread of the deviations in either arm
    p = float(res.pvalue)
    smaller = statistics.variance(a) < statistics.variance(b)
    return (p / 2, 1 - p / 2) if smaller else (1 - p / 2, p / 2)


# --- across claims --------------------------------------------------------------------------------


def holm(pvalues: list[float], alpha: float = 1 - LEVEL) -> tuple[list[bool], list[float]]:
    """Holm's step-down correction (statsmodels multipletests): rejected, adjusted p-values."""
    reject, adjusted = _holm(tuple(float(p) for p in pvalues), alpha)
    return list(reject), list(adjusted)


@lru_cache(maxsize=256)  # multipletests' Holm branch runs gc.collect(): ~0.1 s in a large process
def _holm(pvalues: tuple[float, ...], alpha: float) -> tuple[tuple[bool, ...], tuple[float, ...]]:
    if not pvalues:
        return (), ()
    from statsmodels.stats.multitest import multipletests

    reject, adjusted, _, _ = multipletests(list(pvalues), alpha=alpha, method="holm")
    return tuple(bool(r) for r in reject), tuple(float(p) for p in adjusted)


# --- how many seeds a stated effect needs ---------------------------------------------------------


@lru_cache(maxsize=1024)
def paired_n(effect: float, sd: float, alpha: float, power: float = POWER) -> int:
    """Pairs a one-sided paired t-test needs to find a mean difference ``effect`` when the
    differences' sd is ``sd`` (statsmodels TTestPower); at least 2, at most MAX_N + 1."""
    if effect <= 0:
        return MAX_N + 1
    if sd <= 0:
        return 2
    import warnings

    from statsmodels.stats.power import TTestPower

    try:
        with warnings.catch_warnings():  # no root below the solver's bound: nan, MAX_N + 1 below
            warnings.simplefilter("ignore")
            n = TTestPower().solve_power(effect_size=effect / sd, alpha=alpha, power=power,
                                         alternative="larger")
    except (ValueError, RuntimeError):
        return MAX_N + 1
    n = float(n[0] if hasattr(n, "__len__") else n)
    return max(2, min(MAX_N + 1, math.ceil(n))) if math.isfinite(n) else MAX_N + 1


@lru_cache(maxsize=256)
def spread_n(ratio: float, alpha: float, power: float = POWER) -> int:
    """Seeds per arm a one-sided variance-ratio F test needs to find variances ``ratio`` apart (the
    planning bound for :func:`spread_p`, scipy.stats.f); at least 2, at most MAX_N + 1."""
    from scipy.stats import f

    for n in range(2, MAX_N + 1):
        if f.sf(f.ppf(1 - alpha, n - 1, n - 1) / ratio, n - 1, n - 1) >= power:
            return n
    return MAX_N + 1


@lru_cache(maxsize=1024)
def share_n(p1: float, p2: float | None, alpha: float, power: float = POWER) -> int:
    """Seeds per arm an exact test needs to find shares p1 > p2 (Boschloo, two arms) or p1 > 1/2
    (``p2`` None: the binomial test of one arm) with this power: the power is summed exactly over
    every outcome table; at most MAX_N + 1."""
    from scipy.stats import binom

    for n in range(1, MAX_N + 1):
        if p2 is None:
            got = sum(binom.pmf(k, n, p1) for k in range(n + 1) if share_p(k, n) < alpha)
        elif n > 12:  # exact two-arm enumeration grows as n²: the one-arm bound beyond (rarely reached)
            return MAX_N + 1
        else:
            got = sum(binom.pmf(k1, n, p1) * binom.pmf(k2, n, p2) for k1 in range(n + 1)
                      for k2 in range(k1) if two_arm_p(k1, n, k2, n) < alpha)
        if got >= power:
            return n
    return MAX_N + 1


@dataclass(frozen=True)
class LrSensitivity:
    """Wortsman et al.'s (2023, section 2.2) LR sensitivity of one arm and seed over an lr grid:
    the mean over the grid of ``min(loss(lr), loss_0(lr)) - loss*``, where ``loss*`` is the lowest
    final loss over the grid and ``loss_0`` the run's loss at initialisation, which caps a run that
    diverged or ended worse than it began. Units are the losses' (bits/token in lnexp)."""

    value: float  # nan when no lr of the grid has a run
    best: float  # loss*
    best_lr: float
    lrs: tuple[float, ...]  # the grid's lrs that have a run
    capped: tuple[float, ...]  # ... whose final loss was not finite or above its loss_0
    missing: tuple[float, ...]  # the grid's lrs without a finished run

    @property
    def complete(self) -> bool:
        return not self.missing and bool(self.lrs)


def lr_sensitivity(final: dict[float, float], loss_0: dict[float, float],
                   grid: list[float] | tuple[float, ...] | None = None) -> LrSensitivity:
    """``final``: each lr's final validation loss (nan or inf for a diverged run); ``loss_0``: each
    lr's loss at initialisation (the same for every lr when the seed is: common random numbers);
    ``grid``: the lrs the measure is over (default: those of ``final``). An lr of the grid missing
    from ``final`` is left out of the mean and named in ``missing``."""
    grid = tuple(sorted(grid if grid is not None else final))
    present = tuple(lr for lr in grid if lr in final and math.isfinite(loss_0.get(lr, math.nan)))
    capped, losses = [], {}
    for lr in present:
        loss = final[lr]
        if not math.isfinite(loss) or loss > loss_0[lr]:
            capped.append(lr)
            loss = loss_0[lr]
        losses[lr] = loss
    missing = tuple(lr for lr in grid if lr not in present)
    if not losses:
        return LrSensitivity(math.nan, math.nan, math.nan, (), (), missing)
    best_lr = min(losses, key=lambda lr: losses[lr])
    best = losses[best_lr]
    value = statistics.fmean(v - best for v in losses.values())
    return LrSensitivity(value, best, best_lr, present, tuple(capped), missing)
