"""Seed statistics: the mean of runs that differ only by seed, with its 95% t-interval.

A t-interval rather than a bootstrap: with the 2-5 seeds a study affords, a bootstrap's percentiles
are those of a handful of values and too narrow, whereas the t-interval widens as it should.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

LEVEL = 0.95


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


def summarise(values: list[float]) -> SeedSummary:
    """The finite values' summary; the interval is mean ± t(0.975, n-1) · std / √n."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
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
