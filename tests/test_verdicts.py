"""The one verdict rule (dmls/stats.py `finding`, `verdict`) decides every verdict the report
prints: a finding (faster, slower, heavier, lighter, more or less accurate) exactly when the 95%
interval excludes the null, "within seed noise" when it holds it, "too few seeds to tell" only
where a side has one seed. Each place that prints a verdict is fed intervals that exclude the
null (on either side), hold it, and have no interval."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT, alike
from dmls import stats
from dmls.report import answers, comparisons, observations, special_answers, wording
from dmls.report.phrases import full
from dmls.report.study import Study
from dmls.special.sharding import spec as sharding
from fake_runs import fake_metrics

# Values of two sides whose ratio's (and difference's) interval lies above the null, below it,
# holds it, or has no interval (one value on a side).
CASES = {
    "above": ([1.50, 1.52, 1.48], [1.00, 1.01, 0.99]),
    "below": ([1.00, 1.01, 0.99], [1.50, 1.52, 1.48]),
    "holds": ([0.90, 1.10, 1.00], [1.00, 0.95, 1.05]),
    "one": ([1.50], [1.00, 1.01, 0.99]),
}
EXPECTED = {"above": stats.MORE, "below": stats.LESS, "holds": stats.NO_EFFECT,
            "one": stats.TOO_FEW}  # fmt: skip
WORDS = {stats.MORE: "faster", stats.LESS: "slower", stats.NO_EFFECT: "within seed noise",
         stats.TOO_FEW: "too few seeds to tell"}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_the_rule_is_the_interval_against_the_null(case):
    a, b = CASES[case]
    for comparison in (stats.ratio(a, b), stats.difference(a, b)):
        assert stats.finding(comparison) == EXPECTED[case]
        assert stats.verdict(comparison, "faster", "slower") == WORDS[EXPECTED[case]]


def test_a_narrow_interval_that_excludes_the_null_is_a_finding_and_a_wide_one_too():
    """Before: a bound that rounds to the null printed beside "more accurate" (+0.1, +0.0 to
    +0.2), and an interval wider than 20 points read "too few seeds" though it excluded 0."""
    narrow = stats.Comparison(0.001, 0.0004, 0.002, 3, 3, 0.0)
    assert stats.verdict(narrow, "more accurate", "less accurate") == "more accurate"
    assert (
        wording.points_text(narrow) == "+0.10 points (95% interval +0.04 to +0.20), more accurate"
    )
    wide = stats.Comparison(-0.123, -0.229, -0.017, 2, 2, 0.0)  # A8's RMSprop
    assert wording.points_text(wide).endswith("(95% interval −22.9 to −1.7), less accurate")
    ratio = stats.Comparison(1.13, 1.0004, 1.27, 3, 3, 1.0)  # B2's "1.13× (1.00–1.27×)"
    assert wording.ratio_text(ratio, "faster", "slower") == (
        "1.1300× (95% interval 1.0004–1.2700×), faster"
    )
    _, interval = wording.ratio_strings(ratio)
    low = float(interval.split("–")[0])
    assert low > 1.0, interval  # its lower end never prints as 1
    # An interval that holds the null prints an end as the null only where it is the null:
    # "−0.5 (−1.0 to 0.0), within seed noise" read as if it touched zero from below.
    touching = stats.Comparison(-0.005, -0.0098, 0.00004, 3, 3, 0.0)
    assert wording.points_text(touching) == (
        "−0.500 points (95% interval −0.980 to +0.004), within seed noise"
    )
    exact = stats.Comparison(-0.005, -0.01, 0.0, 3, 3, 0.0)
    assert wording.points_text(exact).endswith("(95% interval −1.0 to 0.0), within seed noise")


@pytest.mark.parametrize("case", CASES)
def test_every_printer_of_a_comparison_gives_the_rules_verdict(case):
    a, b = CASES[case]
    ratio, difference = stats.ratio(a, b), stats.difference(a, b)
    way = EXPECTED[case]
    assert wording.ratio_text(ratio, "faster", "slower").endswith(WORDS[way])
    assert wording.points_text(difference).endswith(
        {stats.MORE: "more accurate", stats.LESS: "less accurate"}.get(way, WORDS[way])
    )
    repeats = WORDS[way].replace("seed", "repeat")
    assert comparisons.Ratio.of(ratio, "x vs y", "repeat").said("faster", "slower") == (
        f"{comparisons.Ratio.of(ratio, 'x vs y', 'repeat').figure}, {repeats}"
    )
    # (a speed: the reference's time over)
    assert full(special_answers.speed(a, b, "x vs y")).endswith(
        {stats.MORE: "faster", stats.LESS: "slower"}.get(way, repeats)
    )
    assert observations.verdict(ratio) == WORDS[way]  # compare.html's conclusions
    # D4's notes give the step times alone (the answer compares them, as `speed` above).
    step = {"processes": 2, "device": "cpu", "stage": "ZeRO-1", "step_ms": 1.5,
            "step_ms_samples": a, "comm_predicted_ms": None}  # fmt: skip
    base = {"step_ms": 1.0, "step_ms_samples": b, "comm_predicted_ms": None}
    said = sharding._step_note(step, base)
    assert said == "2 cpu ranks: a ZeRO-1 step takes 1.5 ms against DDP's 1 ms.", said


def _pair(samples_per_s: float, spread: tuple[float, ...], accuracy: float) -> Study:
    """(Both runs train as many seeds: the seed count is a setting, and a pair that differs
    in it is not a scaling pair.)"""
    base = (0.99, 1.0, 1.01) if len(spread) > 1 else (1.0,)
    one = fake_metrics("one", launcher="single", epochs=3, spread=base)
    ddp = fake_metrics("ddp", launcher="torchrun", nproc_per_node=2, epochs=3,
                       samples_per_s=samples_per_s, test_accuracy=accuracy,
                       spread=spread)  # fmt: skip
    return alike("parallelism", {"baseline": "one"}, [one, ddp])


STUDIES = {  # (the second run's samples/s, its seeds' spread, accuracy; the first: 1000, 80%)
    "above": (1620.0, (0.99, 1.0, 1.01), 0.90),
    "below": (600.0, (0.99, 1.0, 1.01), 0.70),
    "holds": (1002.0, (0.95, 1.0, 1.05), 0.80),
    "one": (1620.0, (1.0,), 0.90),
}


@pytest.mark.parametrize("case", STUDIES)
def test_answers_observations_and_scaling_print_the_rules_verdict(case):
    study = _pair(*STUDIES[case])
    way = EXPECTED[case]
    speed = comparisons.compare(study, "ddp", "one", "samples_per_s", ["launcher"])
    accuracy = comparisons.compare(study, "ddp", "one", "test_accuracy", ["launcher"])
    assert speed.verdict == WORDS[way]
    accurate = {stats.MORE: "more accurate", stats.LESS: "less accurate"}
    assert accuracy.verdict == accurate.get(way, WORDS[way])
    # The answer as the report shows it first (answers.study_answers) prints the same verdict,
    # by the same interval.
    entry = {"factor": ["launcher"], "answer": [{"say": "DDP: {s}; accuracy {a}.", "compare": {
        "s": {"run": "ddp", "vs": "one", "metric": "samples_per_s"},
        "a": {"run": "ddp", "vs": "one", "metric": "test_accuracy"}}}]}  # fmt: skip
    _, [brief] = answers.study_answers(entry, study)
    s, a = speed.without_also(), accuracy.without_also()  # (said once, for the sentence)
    assert brief.startswith(f"DDP: {s.brief}, {s.verdict}; accuracy {a.brief}, {a.verdict}")
    [line] = observations.versus_baseline(study)
    assert f"), {WORDS[way]}; test accuracy" in line or f"×, {WORDS[way]}; test" in line, line
    [scaling] = observations.scaling(study)
    assert WORDS[way] in scaling, scaling


def test_the_efficiency_says_linear_only_where_its_interval_holds_the_ideal():
    linear = stats.Comparison(1.95, 1.85, 2.05, 3, 3, 1.0)
    below = stats.Comparison(1.6, 1.5, 1.7, 3, 3, 1.0)
    assert "linear within seed noise" in observations._efficiency(linear, 2)
    assert "linear" not in observations._efficiency(below, 2)


@pytest.mark.parametrize("slope", [0.66, 0.0])
def test_a_fitted_slope_is_a_finding_only_where_its_interval_excludes_zero(slope):
    runs = [
        fake_metrics(f"b{b}", launcher="torchrun", nproc_per_node=2, batch_size=b, epochs=3,
                     gpu_mib=60.0 + slope * b + (3.0 if b == 32 else 0.0),
                     spread=(1.0, 1.0, 1.0))
        for b in (16, 32, 64, 128)
    ]  # fmt: skip
    line = comparisons.fit(alike("batch_size", {}, runs), "memory", "batch_size")
    assert line["verdict"].startswith("grows" if slope else "within run noise"), line
    assert "4 runs' means" in line["points"]


def test_no_module_judges_an_interval_by_hand():
    """Nothing but dmls/stats.py reads `within_noise` or `low`/`high` against a null to pick
    words: a module that did would be a second rule. (fused_conv and profiler store
    `within_noise` in their summaries as data: a key, not an attribute read.)"""
    scripts = ROOT / "workflow" / "scripts" / "dmls"
    offenders = []
    for path in sorted(scripts.rglob("*.py")):
        if path.name == "stats.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "within_noise":
                offenders.append(f"{path.relative_to(scripts)}:{node.lineno}")
    assert [o.split(":")[0] for o in offenders] == [
        "special/fused_conv/measure.py",
        "special/profiler/measure.py",
    ]
    assert not Path(scripts / "report" / "comparisons.py").read_text().count("TOO_WIDE")


def test_an_interval_of_zero_width_is_said_in_words_not_printed_as_a_range():
    """Before: "1.28× (95% interval 1.28–1.28×), heavier" in a section's observations (warm
    seeds that agree to the byte)."""
    same = stats.ratio([1.28, 1.28], [1.0, 1.0])
    assert wording.ratio_text(same, "heavier", "lighter") == (
        "1.28× (no spread in the seeds compared), heavier"
    )


def test_a_difference_that_rounds_to_zero_carries_no_sign():
    """Before: "fp16 −0.0 points (−0.7 to +0.7)"."""
    assert wording.signed(-0.004) == "0.0" and wording.signed(0.04) == "0.0"
    assert wording.signed(-0.05) == "−0.1" and wording.signed(0.3) == "+0.3"
