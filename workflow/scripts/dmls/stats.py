"""Means over seeds with 95% intervals, and differences and ratios between two runs.

A run trains several seeds (config `seeds`); what the report says of it is the mean over the
seeds with a Student-t interval, and what it says of two runs is their difference (or ratio)
with Welch's interval, which does not assume the two runs vary alike (a 2-GPU run's epoch time
varies more than one GPU's). One seed: a mean and no interval, and the report says so.

Ratios (speed-ups, memory) are taken on log values: the interval of the difference of the mean
logs, exponentiated, is the interval of the ratio of the geometric means, and it stays on the
positive side where a ratio of arithmetic means with a delta-method interval need not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    """A mean over `n` seeds and its interval (`low`, `high`; None with one seed)."""

    mean: float
    n: int
    std: float | None = None  # the sample standard deviation (ddof 1)
    low: float | None = None
    high: float | None = None

    @property
    def half_width(self) -> float | None:
        """Half the interval's width (it is symmetric around the mean)."""
        return None if self.low is None else (self.high - self.low) / 2

    @property
    def has_interval(self) -> bool:
        return self.low is not None

    def covers(self, value: float) -> bool:
        """Whether `value` lies in the interval (False without one)."""
        return self.has_interval and self.low <= value <= self.high

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "mean": self.mean,
            "n": self.n,
            "std": self.std,
            "ci95_low": self.low,
            "ci95_high": self.high,
            "ci95": self.half_width,
        }


def _finite(values: Sequence[float | None]) -> np.ndarray:
    array = np.asarray([v for v in values if v is not None], dtype=float)
    return array[np.isfinite(array)]


def mean_interval(
    values: Sequence[float | None], confidence: float = CONFIDENCE
) -> Estimate | None:
    """The mean of the finite values and its Student-t interval (None when there are none)."""
    x = _finite(values)
    n = len(x)
    if n == 0:
        return None
    mean = float(x.mean())
    if n == 1:
        return Estimate(mean, 1)
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * std / math.sqrt(n)
    return Estimate(mean, n, std, mean - half, mean + half)


def geometric_mean(values: Sequence[float | None]) -> float:
    """The geometric mean of the positive finite values: what `ratio` divides (NaN if none)."""
    x = _finite(values)
    x = x[x > 0]
    return float(np.exp(np.log(x).mean())) if len(x) else math.nan


@dataclass(frozen=True)
class Comparison:
    """`a` against `b`: a difference (a − b) or a ratio (a / b) with its interval (None when
    either side has one seed)."""

    value: float
    low: float | None
    high: float | None
    n_a: int
    n_b: int
    null: float  # no effect: 0 for a difference, 1 for a ratio

    @property
    def has_interval(self) -> bool:
        return self.low is not None

    @property
    def within_noise(self) -> bool | None:
        """True when the interval holds `null` (no effect), None without an interval."""
        if not self.has_interval:
            return None
        return self.low <= self.null <= self.high


def _welch(
    a: np.ndarray, b: np.ndarray, confidence: float
) -> tuple[float, float | None, float | None]:
    """Difference of means a − b and Welch's interval (None, None with fewer than 2 each)."""
    diff = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return diff, None, None
    if np.ptp(a) == 0 and np.ptp(b) == 0:  # both sides repeat one value exactly
        return diff, diff, diff
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(confidence)
    return diff, float(ci.low), float(ci.high)


def difference(
    a: Sequence[float | None], b: Sequence[float | None], confidence: float = CONFIDENCE
) -> Comparison | None:
    """mean(a) − mean(b) with Welch's t interval; None when a side has no finite value."""
    x, y = _finite(a), _finite(b)
    if not len(x) or not len(y):
        return None
    diff, low, high = _welch(x, y, confidence)
    return Comparison(diff, low, high, len(x), len(y), 0.0)


def ratio(
    a: Sequence[float | None], b: Sequence[float | None], confidence: float = CONFIDENCE
) -> Comparison | None:
    """The ratio of the geometric means of positive values a / b, with the interval of Welch's
    t on their logs; None when a side has no positive value."""
    x, y = _finite(a), _finite(b)
    x, y = x[x > 0], y[y > 0]
    if not len(x) or not len(y):
        return None
    diff, low, high = _welch(np.log(x), np.log(y), confidence)
    return Comparison(
        math.exp(diff),
        None if low is None else math.exp(low),
        None if high is None else math.exp(high),
        len(x),
        len(y),
        1.0,
    )
