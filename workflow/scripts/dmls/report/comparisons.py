"""Two runs compared over their seeds, the numbers under an answer's words: which seeds a
metric is compared on (`values`), the ratio or difference with its 95% interval and both means
(`compare`, `Ratio`), the verdict (`judge`), the keys two runs differ in beyond the study's
factor, and a line fitted through every seed (`fit`). A comparison this folder can't make raises
`NotMeasured`, whose message the answer prints. report/answers.py writes the sentences.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from dmls import record, stats
from dmls.config.studies import flatten
from dmls.report.cells import MIB
from dmls.report.study import OK, Study, step_taken
from dmls.report.wording import minus, ratio_strings, signed

# A ratio whose interval spans more than this factor (high / low), or a difference of
# accuracies whose interval is wider than this many points, says nothing a reader can use
# (two seeds give t = 12.7): it is flagged rather than read as a finding.
TOO_WIDE_RATIO = 4.0
TOO_WIDE_POINTS = 20.0
# Spec keys that never make two runs' training differ.
BOOKKEEPING = {"study", "run", "seed", "seeds"}


@dataclass(frozen=True)
class Metric:
    """How a metric is compared and written: as a ratio of geometric means or a difference of
    means, its unit, and the words for more and less of it."""

    label: str
    kind: str  # "ratio" | "points"
    unit: str
    more: str
    less: str
    scale: float = 1.0  # a value's number as written: bytes / MIB, fraction * 100
    decimals: int = 1
    warm_only: bool = False  # GPU memory: the warm seeds' (the first seed's has its own excess)


METRICS = {
    "samples_per_s": Metric("samples/s", "ratio", "samples/s", "faster", "slower", decimals=0),
    "test_accuracy": Metric(
        "test accuracy", "points", "%", "more accurate", "less accurate", scale=100
    ),
    "step_gpu_mem_bytes": Metric(
        "GPU memory a step adds", "ratio", "MiB", "heavier", "lighter", 1 / MIB, warm_only=True
    ),
    "peak_gpu_mem_allocated_bytes": Metric(
        "peak GPU memory", "ratio", "MiB", "heavier", "lighter", 1 / MIB, warm_only=True
    ),
    "peak_host_rss_bytes": Metric("peak host RSS", "ratio", "MiB", "heavier", "lighter", 1 / MIB),
}


class NotMeasured(Exception):
    """A comparison this folder can't make; the message says why, for the reader."""


# What a special study's facts function gives (report/special_answers.py): its case and the
# facts, already written as text.
Facts = tuple[str, dict[str, str]]


@dataclass(frozen=True)
class Compared:
    """One filled comparison: `str()` is the figure with its interval, both means and the
    verdict; `figure` the same without the verdict; `label` what was compared."""

    figure: str
    verdict: str
    label: str = ""

    def __str__(self) -> str:
        return f"{self.figure}, {self.verdict}" if self.verdict else self.figure

    @classmethod
    def not_measured(cls, why: NotMeasured, label: str = "") -> Compared:
        return cls(f"not measured ({why})", "", label)


def values(study: Study, run: str, metric: str) -> list[float]:
    """`run`'s values of `metric` over the seeds it is compared on: every finished seed, or for
    GPU memory the warm seeds (a process's first seed also holds what it built once)."""
    spec = METRICS[metric]
    metrics = study.metrics[run]
    if metric not in record.SEED_METRICS:
        raw = [study.runs.at[run, metric]]
    elif spec.warm_only and (warm := record.warm_seeds(metrics)):
        raw = [record.seed_value(metrics["seeds"][k], metric) for k in warm]
    else:
        raw = [record.seed_value(s, metric) for s in record.finished(metrics["seeds"])]
    return [float(v) for v in raw if v is not None and math.isfinite(float(v))]


def resolve(study: Study, metric: str) -> str:
    """The column of `metric`; "memory" is the memory the study compares (Study.memory: what a
    step adds on GPUs, host RSS on CPUs)."""
    if metric != "memory":
        return metric
    if study.memory is None:
        raise NotMeasured(f"no run of {study.key} finished")
    return study.memory[0]


def compare(
    study: Study,
    run: str,
    vs: str,
    metric: str,
    factor: Sequence[str] = (),
    other: Study | None = None,
) -> Compared:
    """`run` against `vs` (a run of `study`, or "<study>/<run>" of `other`) over their seeds;
    `factor` is what the study changes (dotted spec keys), and any other difference between the
    two specs is said. Raises NotMeasured when either did not finish or lacks the metric."""
    metric = resolve(study, metric)
    spec = METRICS[metric]
    a_study, b_study, b_run = study, study, vs
    if "/" in vs:
        key, b_run = vs.split("/", 1)
        if other is None or other.key != key:
            raise NotMeasured(f"{key} is not in this report")
        b_study = other
    for s, name in ((a_study, run), (b_study, b_run)):
        require_finished(s, name)  # (raises NotMeasured, naming a run the config lacks too)
    a, b = values(a_study, run, metric), values(b_study, b_run, metric)
    if not a or not b:
        raise NotMeasured(f"{run} or {b_run} did not record {spec.label}")
    means = (
        f"{_number(_mean(a, spec), spec)} vs {_number(_mean(b, spec), spec)} {spec.unit}".replace(
            " %", "%"
        )
    )
    alone = "one seed, no interval" if metric in record.SEED_METRICS else "one value per job"
    extra = also_differ(ran(a_study.metrics[run]), ran(b_study.metrics[b_run]), factor)
    also = f"; the two also differ in {extra}" if extra else ""
    if spec.kind == "ratio":
        phrase = Ratio.of(stats.ratio(a, b), means + also, alone, "seed")
        return Compared(minus(phrase.figure), phrase.judge(spec.more, spec.less), spec.label)
    result = stats.difference(a, b)
    figure = f"{signed(100 * result.value)} points"
    interval = result.has_interval and (
        f"{signed(100 * result.low)} to {signed(100 * result.high)}"
    )
    too_wide = result.has_interval and 100 * (result.high - result.low) > TOO_WIDE_POINTS
    inside = f"{interval}; {means}" if interval else f"{means}; {alone}"
    verdict = judge(result, spec.more, spec.less, too_wide)
    return Compared(minus(f"{figure} ({inside}{also})"), verdict, spec.label)


@dataclass(frozen=True)
class Ratio:
    """A ratio as every answer writes it: `figure` is '0.82× (0.75–0.89×; <means>)', `value`
    and `inside` its two parts, the interval with the decimals that tell its ends apart;
    `judge` gives its verdict."""

    result: stats.Comparison
    value: str
    inside: str
    too_wide: bool
    unit: str  # what the noise is over: "seed" or "repeat"

    @property
    def figure(self) -> str:
        return f"{self.value} ({self.inside})"

    @classmethod
    def of(cls, result: stats.Comparison | None, means: str, alone: str, unit: str) -> Ratio:
        """`result` (stats.ratio) with `means` as written; `alone` says why there is no interval
        (one seed, one repeat). Values that agree to the byte (a warm process's GPU memory)
        leave an interval of zero width: none is printed, and there is no noise to judge a
        small difference against."""
        if result is None:
            raise NotMeasured("no value was recorded")
        if result.has_interval and math.isclose(result.low, result.high, rel_tol=1e-9):
            result = replace(result, low=None, high=None)
            alone = f"the same in every {unit}, no interval"
        value, interval = ratio_strings(result)
        too_wide = result.has_interval and result.high / max(result.low, 1e-12) > TOO_WIDE_RATIO
        inside = f"{interval}; {means}" if interval else f"{means}; {alone}"
        return cls(result, value, inside, too_wide, unit)

    def judge(self, more: str, less: str) -> str:
        noise = "within seed noise" if self.unit == "seed" else "within noise"
        return judge(self.result, more, less, self.too_wide, noise, f"too few {self.unit}s to tell")

    def said(self, more: str, less: str) -> str:
        return f"{self.figure}, {self.judge(more, less)}"


def fit(study: Study, metric: str, against: str) -> dict[str, Any]:
    """A least-squares line through every finished run's values of `metric` (each seed's a
    point) against the setting `against`: slope and intercept with 95% intervals, R², and a
    verdict. Raises NotMeasured with fewer than three settings."""
    metric = resolve(study, metric)
    spec = METRICS[metric]
    xs, ys = [], []
    for run in study.ok.index:
        setting = flatten(study.metrics[run]["spec"]).get(against)
        for v in values(study, run, metric):
            xs.append(float(setting))
            ys.append(v * spec.scale)
    if len(set(xs)) < 3:
        raise NotMeasured(f"fewer than three {against} values finished")
    line = scipy_stats.linregress(xs, ys)
    t = scipy_stats.t.ppf(0.975, len(xs) - 2)
    slope_low, slope_high = line.slope - t * line.stderr, line.slope + t * line.stderr
    r2 = line.rvalue**2
    if slope_low <= 0 <= slope_high:
        verdict = "flat within noise"
    elif r2 >= 0.95:
        verdict = "grows linearly" if line.slope > 0 else "falls linearly"
    else:
        verdict = f"{'grows' if line.slope > 0 else 'falls'}, but not along a line"
    unit = spec.unit
    return {
        "slope": minus(
            f"{line.slope:.3f} {unit} per unit of {against} "
            f"(95% interval {slope_low:.3f} to {slope_high:.3f})"
        ),
        "intercept": minus(f"{line.intercept:.1f} {unit}"),
        "r2": f"R² = {r2:.3f}",
        "verdict": verdict,
        "label": spec.label,
    }


class _Fit:
    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)

    def __str__(self) -> str:
        return f"{self.verdict}: {self.slope} plus {self.intercept} ({self.r2})"


def metric_label(study: Study, metric: str) -> str:
    try:
        return METRICS[resolve(study, metric)].label
    except NotMeasured:
        return metric


def short_reason(reason: Any) -> str:
    """A run's reason as an answer quotes it: its first clause, without the advice that
    follows (the section's table gives it whole): "backend 'nccl' runs on CUDA devices only"."""
    text = str(reason or "").split(";")[0].split(" (run it")[0]
    text = re.sub(r"\s*\([^()]{40,}\)", "", text)  # a long aside: a command, its output
    return text.strip().rstrip(".")


def require_finished(study: Study, run: str) -> None:
    if run not in study.runs.index:
        raise NotMeasured(f"the config has no run {run}")
    row = study.runs.loc[run]
    if row["status"] != OK:
        raise NotMeasured(f"{run} {row['status']}: {short_reason(row['reason'])}")


def _mean(xs: list[float], spec: Metric) -> float:
    """The mean a comparison divides or subtracts (stats.ratio: geometric)."""
    return stats.geometric_mean(xs) if spec.kind == "ratio" else float(np.mean(xs))


def _number(value: float, spec: Metric) -> str:
    return f"{value * spec.scale:,.{spec.decimals}f}"


def judge(
    result: stats.Comparison,
    more: str,
    less: str,
    too_wide: bool,
    noise: str = "within seed noise",
    few: str = "too few seeds to tell",
) -> str:
    """The verdict of a comparison: `few` when its interval is too wide to read, `noise` when
    it holds no effect, else `more` or `less` of what it measures ("about the same" for a ratio
    within 2% of one with no interval to judge it by)."""
    if too_wide:
        return few
    if result.within_noise:
        return noise
    if result.value == result.null:
        return "the same"
    ratio = result.null == 1.0
    if not result.has_interval and ratio and abs(math.log(result.value)) < 0.02:
        return "about the same"  # no interval to tell a 2% difference from noise
    return more if result.value > result.null else less


def ran(metrics: dict[str, Any]) -> dict[str, Any]:
    """What a run ran, as dotted keys: its spec, with `step` the step it took (a DataParallel
    run asked for a graph steps eagerly: `step` is then "eager")."""
    flat = flatten(metrics["spec"])
    if taken := step_taken(metrics):
        flat["step"] = taken
    return flat


def also_differ(left: dict[str, Any], right: dict[str, Any], factor: Sequence[str]) -> str:
    """The keys two compared runs differ in beyond the study's factor, with both values:
    "step (graph vs eager)"; empty when they differ in nothing else."""

    def changed_by_design(key: str) -> bool:  # a factor names a key or a group ("optimizer")
        return key in BOOKKEEPING or any(key == f or key.startswith(f"{f}.") for f in factor)

    return ", ".join(
        f"{key} ({_show(left.get(key))} vs {_show(right.get(key))})"
        for key in dict.fromkeys([*left, *right])
        if not changed_by_design(key) and left.get(key) != right.get(key)
    )


def _show(value: Any) -> str:
    return "unset" if value is None else str(value)
