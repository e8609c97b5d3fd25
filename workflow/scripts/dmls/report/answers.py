"""Each study's answer to its question: at most three sentences whose every figure comes from
this results folder, with its interval and a verdict.

The words are templates in report/studies.yaml (`answer:` of a section); this module fills them.
A sentence names its comparisons, each a run against a reference over their seeds:

    - say: "Against one GPU's samples per second, DDP on 2 GPUs: {ddp}."
      compare:
        ddp: {run: ddp_2gpu_dataloader, vs: single_gpu_dataloader, metric: samples_per_s}

`{ddp}` becomes "1.64× (1.58–1.70×; 812 vs 495 samples/s), faster": the ratio, its 95%
interval, both (geometric) means and the verdict (or "slower",
"within seed noise", "too few seeds to tell", ...); `{ddp.figure}` leaves the verdict out and
`{ddp.label}` names the metric. One convention for every ratio: the run's over the
reference's, so > 1 means more of the metric (faster for throughput, heavier for memory).
Two runs compared differ, by the study's design, only in its `factor` keys (a key, or a group
such as `optimizer`); a pair that differs in more says in what, the step a run took counting
rather than the one it asked for. A comparison whose runs did not finish, or are not in the
config, is "not measured (the run and why)", and shows no number. An entry with `facts:`
(A2) takes its numbers from a function of the study and has one template per case.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from dmls import record, stats
from dmls.comm import calls_ms, ddp_buckets, setup_rows
from dmls.config.studies import flatten
from dmls.report.cells import MIB
from dmls.report.observations import RISE_TOLERANCE, held_out_loss, held_out_minimum
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
        _finished(s, name)  # (raises NotMeasured, naming a run the config lacks too)
    a, b = values(a_study, run, metric), values(b_study, b_run, metric)
    if not a or not b:
        raise NotMeasured(f"{run} or {b_run} did not record {spec.label}")
    means = (
        f"{_number(_mean(a, spec), spec)} vs {_number(_mean(b, spec), spec)} {spec.unit}".replace(
            " %", "%"
        )
    )
    alone = "one seed, no interval" if metric in record.SEED_METRICS else "one value per job"
    extra = _also_differ(ran(a_study.metrics[run]), ran(b_study.metrics[b_run]), factor)
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


def overfitting(study: Study) -> tuple[str, dict[str, Any]]:
    """A2 from A1's curves: whether any run's held-out loss passed its minimum and rose again
    while its training loss kept falling (case "overfit"), none did ("no_rise"), or every
    minimum sat at the last epoch, where a rise could not yet show ("still_falling"). The loss
    is the validation split's where the runs have one, else the test set's."""
    histories = {run: h for run, h in study.histories.items() if len(h) >= 2}
    if not histories:
        raise NotMeasured("no run of it finished two epochs")
    column, loss = held_out_loss(histories)
    at_last, overfit, rises = 0, [], []
    for run, h in histories.items():
        best, last, overfits = held_out_minimum(h, column)
        at_last += int(best["epoch"] == last["epoch"])
        if overfits:
            overfit.append(run)
            rises.append(100 * (last[column] / best[column] - 1))
    epochs = sorted({int(h.iloc[-1]["epoch"]) for h in histories.values()})
    facts = {
        "loss": loss,
        "n": len(histories),
        "n_at_last": at_last,
        "n_overfit": len(overfit),
        "overfit_runs": ", ".join(overfit),
        "rise": "–".join(
            dict.fromkeys(f"{r:.0f}" for r in (min(rises, default=0), max(rises, default=0)))
        )
        + "%",
        "epochs": "/".join(map(str, epochs)),
        "tolerance": f"{100 * RISE_TOLERANCE:.0f}%",
    }
    case = "overfit" if overfit else ("still_falling" if at_last == len(histories) else "no_rise")
    return case, facts


def regularization_setting(study: Study) -> tuple[str, dict[str, Any]]:
    """A4's setting, to read its techniques in: whether the bare baseline (`study.baseline`)
    overfit within its epochs (its held-out loss passed its minimum and rose while its training
    loss fell), or its held-out loss was still falling at its last epoch, where a regularizer
    can only slow the fit."""
    base = study.baseline
    history = study.histories.get(base)
    if history is None or len(history) < 2:
        raise NotMeasured(f"the baseline {base} did not finish two epochs")
    column, loss = held_out_loss({base: history})
    best, last, overfits = held_out_minimum(history, column)
    case = "overfit" if overfits else "still_falling"
    gap = 100 * (last["train_accuracy"] - last["test_accuracy"])
    return case, {
        "baseline": base,
        "loss": loss,
        "epochs": str(int(last["epoch"])),
        "best_epoch": str(int(best["epoch"])),
        "gap": minus(f"{gap:+.1f} points"),
    }


def one_host_cause(study: Study, sweep: pd.DataFrame | None) -> tuple[str, dict[str, Any]]:
    """B1: why two processes on one host (`n1xp2`) step slower than one (`n1xp1`). Each run's
    time per optimizer step comes from its steady throughput. Two measured suspects:
    `n1xp2_passive`, the same two processes with OpenMP's idle threads asleep instead of
    spinning (they spin on the cores gloo's threads need while a rank waits on a collective;
    each rank's involuntary context switches show it), and the gradient's all-reduce as the
    collectives sweep of this folder times it (DDP's buckets, the run's backend and device, 2
    processes). Case "spin": the sleeping threads made the step faster beyond seed noise;
    "other": they did not (or were not measured); "faster": two processes were not slower."""
    one, two, passive = "n1xp1", "n1xp2", "n1xp2_passive"
    for run in (one, two):
        _finished(study, run)
    lost = _step_ms(study, two) - _step_ms(study, one)
    facts: dict[str, Any] = {
        "step_one": f"{_step_ms(study, one):.3g} ms",
        "step_two": f"{_step_ms(study, two):.3g} ms",
        "threads": _threads_per_process(study.metrics[two]),
        "switches_two": _switches(study.metrics[two]),
        "all_reduce": _all_reduce(study.metrics[two], sweep, lost),
    }
    try:
        facts["passive"] = compare(study, passive, two, "samples_per_s", ["omp_wait_policy"])
    except NotMeasured as e:
        facts["passive"] = Compared.not_measured(e)
        return ("faster" if lost <= 0 else "other"), facts
    regained = _step_ms(study, two) - _step_ms(study, passive)
    facts |= {
        "step_passive": f"{_step_ms(study, passive):.3g} ms",
        "spin_share": f"{min(regained / lost, 1):.0%}" if lost > 0 else "",
        "switches_passive": _switches(study.metrics[passive]),
    }
    if lost <= 0:
        return "faster", facts
    return ("spin" if facts["passive"].verdict == METRICS["samples_per_s"].more else "other"), facts


def _step_ms(study: Study, run: str) -> float:
    """ms per optimizer step of `run`, each process stepping its own batch, from the geometric
    mean of its seeds' steady throughput."""
    m = study.metrics[run]
    samples = m["spec"]["batch_size"] * m["derived"]["processes"]
    return 1000 * samples / stats.geometric_mean(study.seed_values(run, "samples_per_s"))


def _threads_per_process(metrics: dict[str, Any]) -> str:
    """The intra-op threads each rank had (OMP_NUM_THREADS as launched)."""
    env = (metrics.get("launch") or {}).get("env") or [{}]
    n = env[0].get("OMP_NUM_THREADS")
    return f"{n} thread{'s' if str(n) != '1' else ''}" if n else "an unrecorded number of threads"


def _switches(metrics: dict[str, Any]) -> str:
    """Involuntary context switches per rank over the job (the mean of its ranks)."""
    counts = [r.get("involuntary_context_switches") for r in metrics.get("ranks") or []]
    if not counts or None in counts:
        return "not recorded"
    return f"{np.mean(counts):,.0f}"


def _all_reduce(metrics: dict[str, Any], sweep: pd.DataFrame | None, lost: float) -> str:
    """What the collectives sweep puts one step's gradient all-reduce at, and its share of the
    time `lost` per step, or why it can't say."""
    params = metrics.get("parameters")
    if sweep is None:
        return "not measured (the collectives sweep did not run)"
    if not params:
        return f"not measured ({metrics['run']}'s record has no parameter count)"
    device = "cuda" if str(metrics["ranks"][0]["device"]).startswith("cuda") else "cpu"
    backend, world = metrics["spec"]["backend"], metrics["derived"]["processes"]
    rows = setup_rows(sweep.to_dict("records"), backend, device, world)
    ms = calls_ms(rows, [("all_reduce", b) for b in ddp_buckets(4 * params)])
    if ms is None:
        return f"not measured (the sweep did not time {backend} on {device}, {world} processes)"
    share = f", {min(ms / lost, 9.99):.0%} of the time lost" if lost > 0 else ""
    return f"{ms:.3g} ms for the {4 * params / 1024:,.0f} KiB gradient ({backend}){share}"


# Facts an `answer:` entry names with `facts:`: a function of the study (and the collectives
# sweep, where it ran) giving (case, facts); the entry's `say` has one template per case.
FACTS = {
    "overfitting": overfitting,
    "regularization_setting": regularization_setting,
    "one_host_cause": one_host_cause,
}
# The facts functions that read the collectives sweep.
WITH_SWEEP = {"one_host_cause"}


def sentence(
    entry: dict[str, Any],
    study: Study,
    factor: Sequence[str] = (),
    other: Study | None = None,
    sweep: pd.DataFrame | None = None,
) -> str:
    """One `answer:` entry of report/studies.yaml filled from `study`'s runs, or a sentence
    saying why it can't be."""
    filled: dict[str, Any] = {}
    say = entry["say"]
    if "facts" in entry:
        try:
            name = entry["facts"]
            args = (study, sweep) if name in WITH_SWEEP else (study,)
            case, facts = FACTS[name](*args)
        except NotMeasured as e:
            topic = entry.get("topic", entry["facts"])
            return f"{topic[:1].upper()}{topic[1:]}: not measured here, as {e}."
        filled |= facts
        say = say[case]
    for name, c in (entry.get("compare") or {}).items():
        try:
            filled[name] = compare(study, c["run"], c["vs"], c["metric"], factor, other)
        except NotMeasured as e:
            filled[name] = Compared.not_measured(e, _label(study, c["metric"]))
    for name, f in (entry.get("fit") or {}).items():
        try:
            filled[name] = _Fit(fit(study, f["metric"], f["against"]))
        except NotMeasured as e:
            filled[name] = Compared.not_measured(e, _label(study, f["metric"]))
    return say.format(**filled)


def study_answer(
    texts: dict[str, Any],
    study: Study,
    other: Study | None = None,
    sweep: pd.DataFrame | None = None,
) -> list[str]:
    """The answer of a report/studies.yaml section (`answer`, at most three sentences; the
    study's `factor`, what its runs may differ in) filled from `study`'s runs (and `other`'s,
    the study it is compared with; `sweep`, the collectives sweep's table, where it ran)."""
    factor = texts.get("factor") or []
    return said_once([sentence(e, study, factor, other, sweep) for e in texts.get("answer") or []])


# "not measured (nccl_b32 skipped: backend 'nccl' runs on CUDA devices only)": who, then why.
_NOT_MEASURED = re.compile(
    r"not measured \((?P<who>[^():]+): (?P<why>[^()]*(?:\([^()]*\)[^()]*)*)\)"
)


# "not measured here, as it was skipped: no CUDA device on this host" (special studies).
_NOT_MEASURED_HERE = re.compile(r"not measured here, as (?P<why>.+?)(?=; |\. |\.?$)")


def said_once(sentences: list[str]) -> list[str]:
    """An answer's sentences with each not-measured reason given in full once: a later run
    skipped for the same reason says "(nccl_b128 skipped, as above)", a later part of a
    special study "not measured here (as above)"."""
    seen: set[str] = set()

    def once(match: re.Match) -> str:
        if match["why"] in seen:
            who = match.groupdict().get("who")
            return f"not measured ({who}, as above)" if who else "not measured here (as above)"
        seen.add(match["why"])
        return match[0]

    return [_NOT_MEASURED_HERE.sub(once, _NOT_MEASURED.sub(once, s)) for s in sentences]


def _label(study: Study, metric: str) -> str:
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


def _finished(study: Study, run: str) -> None:
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


def _also_differ(left: dict[str, Any], right: dict[str, Any], factor: Sequence[str]) -> str:
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


def course_comparison(study: Study, table: dict[str, Any]) -> dict[str, Any] | None:
    """The course's reference figures beside this run's, one row per configuration (a
    report/studies.yaml `course_table`: the course's `setting` and, per `run`, its figures as
    written), with the settings in which the two differ: epochs, data, card. Our time is the
    whole training of the seeds of a warm process, as the course timed whole trainings."""
    if not table:
        return None
    course = table.get("setting") or {}
    rows = []
    for entry in table["rows"]:
        run = entry["run"]
        if run not in study.runs.index or study.runs.at[run, "status"] != OK:
            status = study.runs.at[run, "status"] if run in study.runs.index else "not in config"
            rows.append([run, entry["course"], f"no numbers ({status})", ""])
            continue
        metrics = study.metrics[run]
        times = [t for t in record.timed_values(metrics, "train_time_s") if t is not None]
        row = study.runs.loc[run]
        ours = [f"{np.mean(times):,.1f} s", f"{100 * row['test_accuracy']:.1f}% test"]
        if (column := resolve(study, "memory")) in row and row[column] == row[column]:
            ours.insert(1, f"{row[column] / MIB:,.1f} MiB ({METRICS[column].label})")
        data = metrics.get("data") or {}
        host = metrics["host"]
        here = {
            "epochs": str(metrics["spec"]["epochs"]),
            "data": (
                f"{'SYNTHETIC ' if data.get('synthetic') else ''}{data.get('name', '?')}"
                f" ({data.get('n_train', '?'):,} training samples)"
                if isinstance(data.get("n_train"), int)
                else str(data.get("name", "?"))
            ),
            "card": (f"{len(host['gpus'])}× {host['gpus'][0]}" if host.get("gpus") else "CPU"),
        }
        differ = [
            f"{key}: {course[key]} vs {value}"
            for key, value in here.items()
            if key in course and str(course[key]) != value
        ]
        rows.append([run, entry["course"], ", ".join(ours), "; ".join(differ) or "nothing"])
    return {
        "columns": ["configuration", "course", "this run", "differs in (course vs this run)"],
        "rows": rows,
    }


# --- Shared by the special studies' answers (dmls/report/special_answers.py) ---------------


def not_measured(why: str) -> str:
    """A placeholder's text for a part this folder lacks."""
    return f"not measured here, as {why}"


def finished_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary's rows; NotMeasured when the study produced none, or skipped all of them."""
    rows = summary.get("rows") or []
    if not rows:
        raise NotMeasured("the study wrote no results")
    if not any(r.get("status") == OK for r in rows):
        raise NotMeasured(skip_reason(rows))
    return rows


def skip_reason(rows: list[dict[str, Any]]) -> str:
    """Why a part did not run, from the first of `rows` that is not ok: "it was skipped: no
    CUDA device on this host", "it failed: ..."."""
    bad = next((r for r in rows if r.get("status") != OK), None)
    if bad is None:
        return "the config does not measure it"
    why = short_reason(bad.get("reason")) or "no reason was given"
    return f"it {status_verb(bad.get('status'))}: {why}"


def status_verb(status: Any, plural: bool = False) -> str:
    """A row's status as a verb: 'failed', 'was skipped' ('were skipped')."""
    return "failed" if status == "failed" else f"{'were' if plural else 'was'} {status}"


def read_csv_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def speed(reference: list[float], other: list[float], means: str) -> str:
    """`other` against `reference` as a speed, the reference's time over the other's (the ratio
    of their geometric means), with its 95% interval over the repeats where both have two or
    more, the two means (`means`, as written) and a verdict:
    '0.82× (0.75–0.89×; 3.17 ± 0.278 vs 2.59 ± 0.137 ms), slower'."""
    ratio = Ratio.of(stats.ratio(reference, other), means, "one repeat, no interval", "repeat")
    return ratio.said("faster", "slower")


def faster_word(ratio: float) -> str:
    return "faster" if ratio > 1 else "slower" if ratio < 1 else "the same"
