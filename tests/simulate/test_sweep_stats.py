"""Means, 95% intervals and the noise test a sweep reports over seeds."""

from __future__ import annotations

import math
import random

import pytest

from epick.simulate.sweep.stats import estimate, t975, within_noise

# t(0.975, df), from SciPy's stats.t.ppf (six decimals).
T975 = {1: 12.706205, 2: 4.302653, 9: 2.262157, 30: 2.042272, 31: 2.039513, 40: 2.021075, 60: 2.000298}
T975 |= {120: 1.97993, 1000: 1.962339}


@pytest.mark.parametrize(("df", "expected"), sorted(T975.items()))
def test_t_quantiles_match_published_values(df: int, expected: float) -> None:
    assert t975(df) == pytest.approx(expected, abs=2e-6)


def test_an_interval_is_mean_plus_minus_t_s_over_root_n() -> None:
    e = estimate([1.0, 2.0, 3.0])
    assert e.mean == 2.0 and e.n == 3
    assert e.half_width == pytest.approx(4.302653 * 1.0 / math.sqrt(3))
    assert e.interval == pytest.approx((2.0 - e.half_width, 2.0 + e.half_width))


def test_one_seed_has_no_interval_and_nan_stays_nan() -> None:
    assert estimate([5.0]).interval is None and estimate([5.0]).mean == 5.0
    e = estimate([1.0, math.nan])
    assert math.isnan(e.mean) and e.interval is None
    assert within_noise([1.0], [2.0]) is None
    assert within_noise([1.0, math.nan], [2.0, 3.0]) is None


def test_the_interval_covers_the_true_mean_about_95_percent_of_the_time() -> None:
    rng = random.Random(3)
    trials, covered = 2000, 0
    for _ in range(trials):
        interval = estimate([rng.gauss(10.0, 2.0) for _ in range(4)]).interval
        assert interval is not None
        covered += interval[0] <= 10.0 <= interval[1]
    assert 0.93 < covered / trials < 0.97


def test_a_paired_shift_beyond_the_noise_is_a_difference() -> None:
    rng = random.Random(5)
    base = [rng.uniform(0.0, 100.0) for _ in range(5)]  # seed to seed, far more spread than the shift
    shifted = [x + 1.0 + rng.uniform(-0.1, 0.1) for x in base]
    assert within_noise(shifted, base) is False  # paired: the seeds' spread cancels
    noisy = [x + rng.uniform(-1.0, 1.0) for x in base]
    assert within_noise(noisy, base) is True
    assert within_noise(base, base) is True  # equal on every seed


def test_paired_samples_must_be_the_same_length() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        within_noise([1.0, 2.0], [1.0])
