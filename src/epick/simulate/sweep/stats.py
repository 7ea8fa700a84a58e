"""Means and 95% confidence intervals over seeds, and whether two policies differ beyond the noise.

The interval is Student's: mean ± t(0.975, n−1) · s / √n, with s the sample standard deviation. Two
policies run on the same seeds see the same requests and arrivals, so they are compared pairwise:
the difference is within the noise when the interval of the per-seed differences contains 0.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# t(0.975, df) for df = 1 … 30.
_T975 = (
    12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
    2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
    2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272,
)  # fmt: skip
_Z975 = 1.959963984540054


def t975(df: int) -> float:
    """The 97.5th percentile of Student's t with `df` degrees of freedom (df ≥ 1): a table up to 30,
    then the Cornish-Fisher expansion about the normal quantile (Abramowitz & Stegun 26.7.5), within
    1e-6 of the exact value there."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, not {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


@dataclass(frozen=True, slots=True)
class Estimate:
    """A figure's mean over `n` seeds and the half-width of its 95% interval (None for one seed: no
    interval). A mean is NaN when a seed's figure is (a percentile of no requests)."""

    mean: float
    half_width: float | None
    n: int

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.half_width is None or math.isnan(self.mean):
            return None
        return (self.mean - self.half_width, self.mean + self.half_width)


def estimate(values: Sequence[float]) -> Estimate:
    if not values:
        raise ValueError("no values to estimate from")
    n = len(values)
    if any(math.isnan(v) for v in values):
        return Estimate(math.nan, None if n < 2 else math.nan, n)
    mean = math.fsum(values) / n
    if n < 2:
        return Estimate(mean, None, n)
    return Estimate(mean, t975(n - 1) * statistics.stdev(values) / math.sqrt(n), n)


def within_noise(a: Sequence[float], b: Sequence[float]) -> bool | None:
    """Whether `a` and `b`, the same figure on the same seeds in the same order, differ by no more than
    the noise: the 95% interval of the mean of a − b contains 0. None with fewer than two seeds, or
    when a figure is NaN."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    if len(diffs) < 2 or any(math.isnan(d) for d in diffs):
        return None
    interval = estimate(diffs).interval
    assert interval is not None
    return interval[0] <= 0.0 <= interval[1]
