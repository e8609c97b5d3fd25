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
import random
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import cast

import numpy as np

CONFIDENCE = 0.95


def _scipy_stats():
    """scipy.stats, imported when a computation needs it: every training rank imports this
    module (through dmls.record), and scipy was 0.6 s of each rank's start on an H200 host
    (bench/launch_overhead.py, issue #41)."""
    from scipy import stats

    return stats


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
        if self.low is None:
            return None
        assert self.high is not None  # low and high are set together
        return (self.high - self.low) / 2

    @property
    def has_interval(self) -> bool:
        return self.low is not None

    def covers(self, value: float) -> bool:
        """Whether `value` lies in the interval (False without one)."""
        if not self.has_interval:
            return False
        assert self.low is not None and self.high is not None
        return self.low <= value <= self.high

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
    half = float(_scipy_stats().t.ppf((1 + confidence) / 2, n - 1)) * std / math.sqrt(n)
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
    # Why there is no verdict where that is not a side's one seed (across_jobs: no two
    # identical jobs measured how much jobs differ); empty otherwise.
    untold: str = ""
    # What counts as no effect besides the null itself (across_jobs: as far as two jobs of
    # identical settings differed, either way); None: the null alone.
    band: tuple[float, float] | None = None

    @property
    def has_interval(self) -> bool:
        return self.low is not None

    @property
    def within_noise(self) -> bool | None:
        """True when the interval holds `null` (no effect), None without an interval."""
        if not self.has_interval:
            return None
        assert self.low is not None and self.high is not None
        return self.low <= self.null <= self.high

    @property
    def identical(self) -> bool:
        """Both sides repeat one and the same value: an interval of zero width at the null."""
        return self.has_interval and self.low == self.high == self.null

    def against(self, null: float) -> Comparison:
        """The same comparison judged against another null (a speed-up against the ideal), its
        `band` of no effect moved with it (scaled, for a ratio)."""
        band = cast(
            "tuple[float, float] | None",
            self.band and tuple(end * null / self.null for end in self.band),
        )
        return replace(self, null=null, band=band)

    @property
    def finding(self) -> str:
        """The one rule's reading of this comparison (`finding`: MORE, LESS, NO_EFFECT,
        TOO_FEW), so that the words read it without computing it."""
        return finding(self)

    def verdict(self, more: str, less: str, unit: str = "seed") -> str:
        """The one rule's reading in words (`verdict`)."""
        return verdict(self, more, less, unit)


# --- The one verdict rule --------------------------------------------------------------------
# Every sentence, table, caption and compare.html judges a comparison here, by its 95% interval
# alone: a finding (more, less) exactly when the interval excludes the null, otherwise no
# effect ("within seed noise"); "too few" only where a side has fewer than two seeds (no
# interval). No width, no size of effect and no one-seed value overrides it.
MORE, LESS, NO_EFFECT, TOO_FEW = "more", "less", "no effect", "too few"


def finding(comparison: Comparison) -> str:
    """MORE or LESS when the 95% interval excludes the null, NO_EFFECT when it holds it,
    TOO_FEW without an interval (a side with one seed)."""
    if not comparison.has_interval or comparison.untold:
        return TOO_FEW
    low, high = comparison.band or (comparison.null, comparison.null)
    assert comparison.low is not None and comparison.high is not None
    if comparison.low > high:
        return MORE
    if comparison.high < low:
        return LESS
    return NO_EFFECT


def verdict(comparison: Comparison, more: str, less: str, unit: str = "seed") -> str:
    """`finding` in words: `more` or `less` ("faster", "heavier"), "within seed noise",
    "identical in every seed compared" (both sides one value, the same), or "too few seeds to
    tell"; `unit` is what the noise is over ("seed", "repeat")."""
    way = finding(comparison)
    if way == TOO_FEW:
        return (
            f"no verdict: {comparison.untold}" if comparison.untold else f"too few {unit}s to tell"
        )
    if way == NO_EFFECT:
        if comparison.identical:
            return f"identical in every {unit} compared"
        assert comparison.low is not None and comparison.high is not None  # NO_EFFECT has one
        if comparison.band and not comparison.low <= comparison.null <= comparison.high:
            return "within job noise"
        return f"within {unit} noise"
    return more if way == MORE else less


def _welch(
    a: np.ndarray, b: np.ndarray, confidence: float
) -> tuple[float, float | None, float | None]:
    """Difference of means a − b and Welch's interval (None, None with fewer than 2 each)."""
    diff = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return diff, None, None
    if np.ptp(a) == 0 and np.ptp(b) == 0:  # both sides repeat one value exactly
        return diff, diff, diff
    ci = _scipy_stats().ttest_ind(a, b, equal_var=False).confidence_interval(confidence)
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


@dataclass(frozen=True)
class JobNoise:
    """How much two jobs of identical settings differed (A/A jobs): the largest ratio between
    two of them (≥ 1), over `jobs` jobs in groups of identical settings (`labels`, as the
    caller names them)."""

    largest: float
    jobs: int
    labels: tuple[tuple[str, ...], ...] = ()


def job_noise(groups: Sequence[Sequence[float]]) -> JobNoise | None:
    """`JobNoise` from groups of positive values, each one value per job (a job's geometric
    mean over its seeds) of jobs with identical settings; None without a group of two."""
    arrays = [g[g > 0] for g in (_finite(g) for g in groups)]
    arrays = [g for g in arrays if len(g) >= 2]
    if not arrays:
        return None
    return JobNoise(max(float(g.max() / g.min()) for g in arrays), sum(len(g) for g in arrays))


UNTOLD_JOBS = (
    "no two jobs of identical settings ran on this kind of device to measure how much jobs differ"
)


def across_jobs(
    a: Sequence[float | None],
    b: Sequence[float | None],
    noise: JobNoise | None,
    confidence: float = CONFIDENCE,
) -> Comparison | None:
    """The ratio of geometric means a / b (`ratio`, its interval over the seeds) of two jobs,
    where no effect is anything as far from 1 as two jobs of identical settings differed
    (`band`: 1 / noise.largest to noise.largest): a finding only where the whole interval lies
    beyond it. Without `noise` (no two identical jobs measured it) it has no verdict: the seeds
    within one job can't see what varies between jobs. None without a value."""
    result = ratio(a, b, confidence)
    if result is None or not result.has_interval:
        return result
    if noise is None:
        return replace(result, untold=UNTOLD_JOBS)
    return replace(result, band=(1 / noise.largest, noise.largest))


def times_across_jobs(
    a: Sequence[float | None],
    b: Sequence[float | None],
    noise: JobNoise | None,
    confidence: float = CONFIDENCE,
) -> Comparison | None:
    """A difference of two jobs' times a − b (`difference`, its interval over the seeds), where
    no effect is anything within what two identical jobs differed by, as a fraction of b's
    mean time (`band`: ± (noise.largest − 1) × mean b); without `noise` no verdict, as
    `across_jobs`."""
    result = difference(a, b, confidence)
    if result is None or not result.has_interval:
        return result
    if noise is None:
        return replace(result, untold=UNTOLD_JOBS)
    reach = (noise.largest - 1) * float(np.mean(_finite(b)))
    return replace(result, band=(-reach, reach))


def change(values: Sequence[float | None], confidence: float = CONFIDENCE) -> Comparison | None:
    """The mean of paired changes (each seed's value at one point minus at another) against
    no change (null 0), with its Student-t interval over them; None without a finite value."""
    estimate = mean_interval(values, confidence)
    if estimate is None:
        return None
    return Comparison(estimate.mean, estimate.low, estimate.high, estimate.n, estimate.n, 0.0)


def turns(conditions: Sequence[str], repeats: int, seed: int) -> list[list[str]]:
    """The order each repeat of a timed comparison measures its `conditions` in: every
    condition once per repeat, in an order drawn afresh for each (seeded: a rerun takes the
    same turns), so that what drifts over the study falls on every condition alike and into
    the interval over the repeats, never between conditions measured one block after another."""
    rng = random.Random(seed)
    return [rng.sample(list(conditions), len(conditions)) for _ in range(repeats)]


def paired_ratio(
    a: Sequence[float | None], b: Sequence[float | None], confidence: float = CONFIDENCE
) -> Comparison | None:
    """The geometric mean of a[i] / b[i], each pair measured together (one repeat's pass), with
    Student's t interval on the logs of the ratios; None without a positive pair."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x and y and x > 0 and y > 0]
    logs = [math.log(x / y) for x, y in pairs if math.isfinite(x / y)]
    estimate = mean_interval(logs, confidence)
    if estimate is None:
        return None
    low = None if estimate.low is None else math.exp(estimate.low)
    high = None if estimate.high is None else math.exp(estimate.high)
    return Comparison(math.exp(estimate.mean), low, high, estimate.n, estimate.n, 1.0)


def paired(
    how: Callable[..., Comparison | None],
    a: Mapping[Hashable, float],
    b: Mapping[Hashable, float],
    confidence: float = CONFIDENCE,
) -> Comparison | None:
    """`how` (`difference` or `ratio`) of two runs' values keyed by seed, under the paired rule:
    where both were measured on the same seeds (at least two) and each seed gave both runs the
    same value, the difference of every pair is zero, so the comparison sits at its null with
    an interval of zero width there (`Comparison.identical`), whatever each side's spread
    (Welch's interval over the two sides would read seed noise into two identical runs);
    otherwise `how` over the values."""
    same = len(a) >= 2 and a.keys() == b.keys() and all(a[k] == b[k] for k in a)
    result = how(list(a.values()), list(b.values()), confidence)
    if not same or result is None:
        return result
    return Comparison(result.null, result.null, result.null, len(a), len(b), result.null)


@dataclass(frozen=True)
class Line:
    """A least-squares line through `n` points: the slope as a Comparison against no slope
    (null 0, Student-t interval with n − 2 degrees of freedom), the intercept and R²."""

    slope: Comparison
    intercept: float
    r2: float
    n: int


def line(xs: Sequence[float], ys: Sequence[float], confidence: float = CONFIDENCE) -> Line:
    """The least-squares line through (xs, ys), one point per independent unit (a run's mean
    over its seeds, never each copy of one value); the slope has no interval with fewer than
    three points."""
    fit = _scipy_stats().linregress(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float))
    n = len(xs)
    low = high = None
    if n > 2:
        half = float(_scipy_stats().t.ppf((1 + confidence) / 2, n - 2)) * fit.stderr
        low, high = fit.slope - half, fit.slope + half
    slope = Comparison(float(fit.slope), low, high, n, n, 0.0)
    return Line(slope, float(fit.intercept), float(fit.rvalue**2), n)


def curvature(
    xs: Sequence[float], ys: Sequence[float], confidence: float = CONFIDENCE
) -> Comparison:
    """The quadratic term of the least-squares parabola through (xs, ys), one point per
    independent unit as for `line`, as a Comparison against no curvature (null 0), with its
    Student-t interval on n − 3 degrees of freedom (none with fewer than four points): where the
    interval holds 0, the points give no evidence that they bend off a line; where it excludes
    0, they bend."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    n = len(x)
    design = np.column_stack([x**2, x, np.ones(n)])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    low = high = None
    if n > 3:
        residual = y - design @ coef
        sigma2 = float(residual @ residual) / (n - 3)
        se = math.sqrt(sigma2 * float(np.linalg.inv(design.T @ design)[0, 0]))
        half = float(_scipy_stats().t.ppf((1 + confidence) / 2, n - 3)) * se
        low, high = float(coef[0]) - half, float(coef[0]) + half
    return Comparison(float(coef[0]), low, high, n, n, 0.0)


# --- Proportions (D2's Monte Carlo) ------------------------------------------------------------


def median_interval(
    values: Sequence[float | None], confidence: float = CONFIDENCE
) -> tuple[float, float | None, float | None]:
    """The median of the finite values and its distribution-free interval: the order
    statistics x(l) and x(n+1−l), where l − 1 is the binomial(n, ½) quantile below
    (1 − confidence)/2, so that the median lies between them with at least `confidence`
    (no shape assumed: call times have a long right tail). No interval (None, None) with
    fewer than 6 values at 95%."""
    x = np.sort(_finite(values))
    if not len(x):
        raise ValueError("no finite value to take the median of")
    median = float(np.median(x))
    n = len(x)
    low_index = int(_scipy_stats().binom.ppf((1 - confidence) / 2, n, 0.5))  # l, 1-based
    if low_index < 1:
        return median, None, None
    return median, float(x[low_index - 1]), float(x[n - low_index])


def proportion_interval(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (sound near 0 and 1, unlike p ± z·se)."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    phat = successes / trials
    denom = 1 + z * z / trials
    centre = (phat + z * z / (2 * trials)) / denom
    half = z * math.sqrt(phat * (1 - phat) / trials + z * z / (4 * trials * trials)) / denom
    # At 0 or n successes one end is exactly the bound; computed, it would be off by rounding.
    low = 0.0 if successes == 0 else centre - half
    high = 1.0 if successes == trials else centre + half
    return low, high


def misses_tail(outside: int, intervals: int, confidence: float) -> float:
    """The binomial chance of at least `outside` of `intervals` intervals at `confidence`
    missing their true value, each with probability 1 - confidence (1 with none outside)."""
    if not outside:
        return 1.0
    return float(_scipy_stats().binom.sf(outside - 1, intervals, 1 - confidence))


def by_chance(tail: float) -> bool:
    """Whether a chance (`misses_tail`) is within what chance gives, at the one rule's level:
    at least 1 - CONFIDENCE."""
    return tail >= 1 - CONFIDENCE
