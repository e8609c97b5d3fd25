"""The interval arithmetic of dmls/stats.py against values computed by hand."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from dmls import stats
from dmls.stats import difference, mean_interval, ratio


@pytest.mark.parametrize(
    # Two-sided 95% Student t quantiles from a printed table: t(0.975, n − 1).
    ("values", "t"),
    [([1.0, 2.0, 3.0], 4.302653), ([0.5, 0.7], 12.706205), ([2.0, 4.0, 4.0, 6.0], 3.182446)],
)
def test_mean_interval_is_the_student_t_interval(values, t):
    n = len(values)
    mean = sum(values) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    estimate = mean_interval(values)
    assert estimate.mean == pytest.approx(mean) and estimate.n == n
    assert estimate.std == pytest.approx(s)
    assert estimate.half_width == pytest.approx(t * s / math.sqrt(n), rel=1e-6)
    assert estimate.low == pytest.approx(mean - t * s / math.sqrt(n), rel=1e-6)
    assert estimate.covers(mean) and not estimate.covers(mean + 2 * t * s)


def test_one_value_has_no_interval_and_none_is_skipped():
    one = mean_interval([0.8, None, float("nan")])
    assert one.mean == 0.8 and one.n == 1 and not one.has_interval and one.half_width is None
    assert mean_interval([None]) is None


def test_difference_is_welchs_interval():
    a, b = [1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0]
    # By hand: variances 1 and 20/3, standard error sqrt(1/3 + 5/3) = sqrt(2), and
    # Welch–Satterthwaite's degrees of freedom 4 / ((1/3)^2/2 + (5/3)^2/3).
    se = math.sqrt(2.0)
    df = 4 / ((1 / 3) ** 2 / 2 + (5 / 3) ** 2 / 3)
    half = scipy_stats.t.ppf(0.975, df) * se
    d = difference(a, b)
    assert d.value == pytest.approx(-3.0)
    assert (d.low, d.high) == (pytest.approx(-3.0 - half), pytest.approx(-3.0 + half))
    assert d.within_noise is True  # the interval holds 0: within seed noise
    far = difference([10.0, 10.2, 10.1], [1.0, 1.1, 0.9])
    assert far.within_noise is False and far.low > 0


def test_ratio_is_the_interval_of_the_log_difference_exponentiated():
    a, b = [2.0, 2.2, 2.1], [1.0, 1.05, 0.98]
    logs = difference([math.log(v) for v in a], [math.log(v) for v in b])
    r = ratio(a, b)
    assert r.value == pytest.approx(math.exp(logs.value))
    assert r.low == pytest.approx(math.exp(logs.low)) and r.high == pytest.approx(
        math.exp(logs.high)
    )
    assert r.null == 1.0 and r.within_noise is False
    single = ratio([2.0], [1.0, 1.1])
    assert single.value == pytest.approx(2 / math.sqrt(1.1)) and not single.has_interval
    assert single.within_noise is None


def test_sides_that_repeat_one_value_exactly_give_a_zero_width_interval():
    d = difference([0.5, 0.5], [0.25, 0.25])
    assert (d.value, d.low, d.high) == (0.25, 0.25, 0.25) and d.within_noise is False


def test_two_runs_the_same_in_every_seed_are_identical_whatever_their_spread():
    """B2/B3's accuracy: each seed gave both runs the same value, the seeds differed; Welch's
    interval over the two sides read "0.0 points (−0.2 to +0.2), within seed noise"."""
    a = {0: 0.80, 1: 0.83, 2: 0.78}
    unpaired = stats.difference(list(a.values()), list(a.values()))
    assert unpaired.low < 0 < unpaired.high and not unpaired.identical
    same = stats.paired(stats.difference, a, dict(a))
    assert same.identical and (same.value, same.low, same.high) == (0.0, 0.0, 0.0)
    assert stats.verdict(same, "more", "less") == "identical in every seed compared"
    ratio = stats.paired(stats.ratio, a, dict(a))
    assert ratio.identical and ratio.value == 1.0
    # Not paired: other seeds, one seed, or one seed's values apart by a bit.
    assert not stats.paired(stats.difference, a, {3: 0.80, 4: 0.83, 5: 0.78}).identical
    assert stats.paired(stats.difference, {0: 0.8}, {0: 0.8}).has_interval is False
    assert not stats.paired(stats.difference, a, a | {2: 0.78 + 1e-12}).identical


def test_whether_a_sweep_bends_is_the_interval_of_its_curvature_not_a_threshold():
    """A6's step memory (version 3), 99.7, 99.9, 117.0 and 157.9 MiB at batch 16 to 128, was
    called "not along a line" by R² = 0.975 < 0.99, a threshold set from that very result."""
    xs = [16, 32, 64, 128]
    straight = stats.curvature(xs, [10 + 2 * x for x in xs])
    assert straight.value == pytest.approx(0, abs=1e-9) and straight.identical is False
    bent = stats.curvature(xs, [x**2 / 100 + 5 for x in xs])
    assert stats.finding(bent) == stats.MORE and bent.value == pytest.approx(0.01)
    # The example's four means: one degree of freedom, an interval that holds no bend.
    example = stats.curvature(xs, [99.7, 99.9, 117.0, 157.9])
    assert example.low < 0 < example.high and stats.finding(example) == stats.NO_EFFECT
    # numpy's fit and scipy's t: the same quadratic term and the same interval.
    coef = np.polyfit(xs, [99.7, 99.9, 117.0, 157.9], 2)
    assert example.value == pytest.approx(coef[0])
    assert stats.curvature(xs[:3], [1, 2, 5]).has_interval is False  # three points: none


def test_a_medians_interval_is_two_order_statistics_that_hold_it_with_95_percent():
    """The collectives sweep's latency per size (issue #56): distribution-free, from the
    binomial(n, 1/2) law of how many calls fall below the true median."""
    import scipy.stats

    assert stats.median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, None, None)  # n = 5: none
    assert stats.median_interval([6.0, 1.0, 2.0, 5.0, 4.0, 3.0]) == (3.5, 1.0, 6.0)
    values = list(range(1, 21))  # n = 20: x(6) and x(15), coverage 1 - 2 P(B <= 5) = 95.9%
    assert stats.median_interval(values) == (10.5, 6.0, 15.0)
    assert (
        1 - 2 * scipy.stats.binom.cdf(5, 20, 0.5)
        >= 0.95
        > 1 - 2 * scipy.stats.binom.cdf(6, 20, 0.5)
    )
