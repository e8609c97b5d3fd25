"""D2: closed forms of the failure probability with and without a spare, and Monte Carlo."""

import csv

import numpy as np
import pytest

from dmls import stats
from dmls.special.spare_failure import measure as spare_failure


def test_closed_forms_for_two_machines_by_hand():
    p = [0.1, 0.2]
    assert spare_failure.p_fail_no_spare(p) == pytest.approx(1 - 0.9 * 0.8)  # 0.28
    assert spare_failure.p_exactly_one(p) == pytest.approx(0.1 * 0.8 + 0.2 * 0.9)  # 0.26
    assert spare_failure.p_fail_with_spare(p) == pytest.approx(0.1 * 0.2)  # both fail
    assert spare_failure.spare_reduction(p) == pytest.approx(0.26)


@pytest.mark.parametrize("seed", range(5))
def test_the_reduction_formula_is_the_chance_that_exactly_one_fails(seed):
    p = np.random.default_rng(seed).uniform(0, 0.9, size=seed + 2)
    forms = spare_failure.closed_forms(p)
    assert forms["reduction"] == pytest.approx(spare_failure.p_exactly_one(p), rel=1e-12)
    assert forms["no_spare"] - forms["with_spare"] == pytest.approx(forms["reduction"], rel=1e-9)
    assert sum(spare_failure.failure_counts(p)) == pytest.approx(1.0)


def test_small_probabilities_keep_their_digits():
    # Two machines at 1e-9: the spare fails only if both do, 1e-18, which 1 - prod(1 - p)
    # minus P(one fails) would lose to cancellation.
    assert spare_failure.p_fail_with_spare([1e-9, 1e-9]) == pytest.approx(1e-18, rel=1e-9)
    assert spare_failure.p_fail_no_spare([1e-9, 1e-9]) == pytest.approx(2e-9 - 1e-18, rel=1e-12)


def test_wilson_interval_matches_the_textbook_value():
    low, high = stats.proportion_interval(50, 100, 0.95)
    assert (low, high) == (pytest.approx(0.4038, abs=1e-4), pytest.approx(0.5962, abs=1e-4))
    assert stats.proportion_interval(0, 1000, 0.99)[0] == 0.0


@pytest.mark.parametrize("p", [[0.05] * 4, [0.01, 0.02, 0.05, 0.1, 0.2], [0.3], [0.01] * 7 + [0.3]])
def test_monte_carlo_with_a_million_trials_brackets_the_closed_forms(p):
    rows = spare_failure.compare("v", p, 1_000_000, 0.999, np.random.default_rng(0))
    assert [r["quantity"] for r in rows] == list(spare_failure.QUANTITIES)
    for r in rows:
        assert r["ci_low"] <= r["closed_form"] <= r["ci_high"], r
        assert r["ci_high"] - r["ci_low"] < 0.005  # a million trials pin it down


@pytest.mark.parametrize("p", [[], [1.0], [0.1, -0.1], [[0.1]]])
def test_invalid_probabilities_are_refused(p):
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        spare_failure.closed_forms(p)


def test_run_writes_tables_and_figure(tmp_path):
    cfg = {"p_vectors": {"pair": [0.1, 0.2]}, "curve_p": [0.1], "curve_n": [1, 2, 3],
           "trials": 100_000, "confidence": 0.999, "seed": 1}  # fmt: skip
    result = spare_failure.run(cfg, tmp_path)
    assert [r["quantity"] for r in result["rows"]] == list(spare_failure.QUANTITIES)
    assert result["outside_ci"] == 0 and result["curve_points"] == 9
    with open(tmp_path / "curve.csv") as f:
        curve = list(csv.DictReader(f))
    one_machine = [r for r in curve if r["n"] == "1" and r["quantity"] == "with_spare"]
    assert float(one_machine[0]["closed_form"]) == 0.0  # the spare covers the only machine
    assert (tmp_path / "failure_vs_n.png").stat().st_size > 0
