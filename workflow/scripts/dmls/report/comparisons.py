"""Two runs compared over their seeds, as an answer's words say it: which seeds a metric is
compared on and how the text names them, the ratio or difference with its 95% interval and both
means (`compare`, `Ratio`), its verdict (the one rule, read off quantities.compare's result), the
keys two runs differ in beyond the study's factor, and a line fitted through the runs' means
(`fit`). Every number comes from dmls.report.quantities. A comparison this folder can't make raises
`NotMeasured`, whose message the answer prints. report/answers.py writes the sentences.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from dmls.config.studies import flatten
from dmls.report import quantities
from dmls.report.cells import MIB
from dmls.report.phrases import Phrase, figure
from dmls.report.study import OK, Study
from dmls.report.wording import inside, minus, no_range, points_strings, ratio_strings

# Spec keys that never make two runs' training differ.
BOOKKEEPING = quantities.BOOKKEEPING


@dataclass(frozen=True)
class Metric:
    """How a metric is written: its label, its unit, and the words for more and less of it (how
    it is compared, a ratio or a difference, is quantities.kind's)."""

    label: str
    unit: str
    more: str
    less: str
    scale: float = 1.0  # a value's number as written: bytes / MIB, fraction * 100
    decimals: int = 1


METRICS = {
    "samples_per_s": Metric("samples/s", "samples/s", "faster", "slower", decimals=0),
    "test_accuracy": Metric("test accuracy", "%", "more accurate", "less accurate", scale=100),
    "step_gpu_mem_bytes": Metric("GPU memory a step adds", "MiB", "heavier", "lighter", 1 / MIB),
    "peak_gpu_mem_allocated_bytes": Metric("peak GPU memory", "MiB", "heavier", "lighter", 1 / MIB),
    "peak_host_rss_bytes": Metric("peak host RSS", "MiB", "heavier", "lighter", 1 / MIB),
    "graph_pool_reserved_bytes": Metric(
        "CUDA-graph pool, reserved", "MiB", "heavier", "lighter", 1 / MIB
    ),
}


class NotMeasured(Exception):
    """A comparison this folder can't make; the message says why, for the reader: `who` (the
    run and how it ended, "nccl_b32 skipped") and `why`, where a run did not finish."""

    def __init__(self, message: str, who: str = "", why: str = "") -> None:
        super().__init__(message)
        self.who, self.why = who, why


@dataclass(frozen=True)
class Compared:
    """One filled comparison, held as its parts and written on demand: `str()` is the figure
    with its interval, both means and the verdict; `figure` the same without the verdict;
    `brief` as the Answers list gives it (the value with its interval, or why there is none,
    the seeds where not every one counts, and what else the two differ in, without the
    means); `label` what was compared. Nothing here edits a written sentence: leaving out what
    else the two differ in (`without_also`) writes the parts again without it."""

    value: str
    verdict: str
    label: str = ""
    kind: str = "ratio"  # "ratio" | "points": where the means and the interval sit
    interval: str | None = None  # '0.75–0.89×', None without one
    means: str = ""  # both means, with the seeds and a first seed's excess where said
    seeds: str = ""  # the seeds it is over (and memory's size), as the brief names them
    why: str | None = None  # why no range is printed (wording.no_range)
    differ: str = ""  # the keys the two runs also differ in (also_differ)
    unchanged: str = ""  # "; fp16 computed in fp32 here, ..." (not_changed)
    shared: bool = False  # `differ` said once for the sentence (answers.said_once_for_all)
    missing: str = ""  # why it was not measured (then no number)
    # Where a run did not finish: the run and how it ended, and why; `as_above`: that reason
    # was said in full before in the same answer (answers.study_answers), so it says so.
    who: str = ""
    why_not: str = ""
    as_above: bool = False
    # The numbers the words render (None where not measured): a case is chosen on the
    # finding of these (the one rule), never on the verdict's words.
    result: quantities.Comparison | None = None
    brief_form: bool = False

    @property
    def also(self) -> str:
        """What else the two runs differ in, as the figure says it (nothing where its sentence
        says it once for all its comparisons: `shared`)."""
        if self.shared:
            return ""
        return minus(
            (f"; the two also differ in {self.differ}" if self.differ else "") + self.unchanged
        )

    @property
    def also_for_each(self) -> str:
        """The same, said once for a sentence whose every pair shares it."""
        return minus(
            "; ".join(
                filter(
                    None,
                    (
                        f"each pair also differs in {self.differ}" if self.differ else "",
                        self.unchanged.removeprefix("; "),
                    ),
                )
            )
        )

    @property
    def figure(self) -> str:
        if self.missing:
            said = f"{self.who}, as above" if self.as_above else self.missing
            return f"not measured ({said})"
        if self.brief_form:
            return self.brief
        if self.kind == "ratio":
            means = self.means + self.also
            inside = f"{means}; {self.why}" if self.why else f"{self.interval}; {means}"
            return minus(f"{self.value} ({inside})")
        inside = f"{self.means}; {self.why}" if self.why else f"{self.interval}; {self.means}"
        return minus(f"{self.value} ({inside}{self.also})")

    @property
    def brief(self) -> str:
        if self.missing:
            return self.figure
        inside = "; ".join(filter(None, (self.seeds, self.why or self.interval)))
        return minus(f"{self.value} ({inside}{self.also})")

    @property
    def finding(self) -> str | None:
        """The rule's finding of `result` (quantities.MORE, LESS, NO_EFFECT, TOO_FEW); None not
        measured."""
        return None if self.result is None else self.result.finding

    def __str__(self) -> str:
        return f"{self.figure}, {self.verdict}" if self.verdict else self.figure

    def without_also(self) -> Compared:
        """The same comparison, what else the two differ in said once for its sentence
        (answers.said_once_for_all)."""
        return replace(self, shared=True)

    def briefly(self) -> Compared:
        """The comparison as the Answers list words it (`brief`)."""
        return replace(self, brief_form=True)

    @classmethod
    def not_measured(cls, why: NotMeasured, label: str = "") -> Compared:
        return cls("", "", label, missing=str(why), who=why.who, why_not=why.why)


def values(study: Study, run: str, metric: str) -> list[float]:
    """`run`'s values of `metric` over the seeds it counts (Study.seed_values)."""
    return study.seed_values(run, metric)


def seeds_said(study: Study, run: str, metric: str) -> str:
    """Which of `run`'s seeds `metric` is counted over, as the text names them (RunNumbers)."""
    return study.numbers[run].seeds_said(metric)


def first_seeds(runs: Sequence[tuple[Study, str]], metric: str, spec: Metric) -> str:
    """Where a process's first seed measured more than its warm ones (left out by
    record.counted_seeds), by how much and why: "; each job's first seed measured 39.6 vs 28.0
    MiB more (cuDNN's autotuning ...)"; empty where none did."""
    numbers = [study.numbers[run] for study, run in runs]
    excess = [n.first_seed_excess(metric) for n in numbers]
    if max(excess) * spec.scale < 0.05:
        return ""
    why = (
        "not measured further for eager steps"
        if any(n.eager for n, e in zip(numbers, excess, strict=True) if e)
        else "not isolated for these runs; bench/seed_memory.py measured such an excess as "
        "cuDNN's autotuning workspaces, paid once per process, on another host"
    )
    amounts = " vs ".join(_number(e, spec) for e in excess)
    return f"; each job's first seed measured {amounts} {spec.unit} more ({why})"


def resolve(study: Study, metric: str) -> str:
    """The column of `metric`; "memory" is the memory the study compares (Study.memory: the
    peak allocated GPU memory on GPUs, host RSS on CPUs)."""
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
        if other is None:  # (section.py: compare_with unset, or the study it names has no runs)
            raise NotMeasured(
                f"{study.key} is not compared with {key} here: studies.{study.key}.compare_with "
                f"does not name it, or {key} has no runs"
            )
        if other.key != key:
            raise NotMeasured(
                f"{study.key} is compared with {other.key}, not {key} "
                f"(studies.{study.key}.compare_with)"
            )
        b_study = other
    for s, name in ((a_study, run), (b_study, b_run)):
        require_finished(s, name)  # (raises NotMeasured, naming a run the config lacks too)
    a, b = values(a_study, run, metric), values(b_study, b_run, metric)
    if not a or not b:
        raise NotMeasured(f"{run} or {b_run} did not record {spec.label}")
    mean_a, mean_b = quantities.mean(a_study, run, metric), quantities.mean(b_study, b_run, metric)
    means = f"{_number(mean_a, spec)} vs {_number(mean_b, spec)} {spec.unit}".replace(" %", "%")
    said = {seeds_said(a_study, run, metric), seeds_said(b_study, b_run, metric)}
    seeds = ""  # (said in the brief too; the means and the first seeds' excess are not)
    if quantities.warm(metric) or len(said) > 1:  # (else: every finished seed)
        seeds = " vs ".join(sorted(said))
        means += f", {seeds}" + first_seeds(((a_study, run), (b_study, b_run)), metric, spec)
    extra = also_differ(
        quantities.ran(a_study.metrics[run]), quantities.ran(b_study.metrics[b_run]), factor
    )
    unchanged = not_changed(a_study.metrics[run], b_study.metrics[b_run], factor)
    unit = quantities.noise_unit(metric)
    result = quantities.compare(a_study, run, b_run, metric, b_study)
    if result is None:
        raise NotMeasured("no value was recorded")
    kind = quantities.kind(metric)
    if kind == "ratio":
        value, interval = ratio_strings(result)
        # Memory's size in MiB and % too: a ratio near 1 may be a finding of a few bytes (a
        # warm process's seeds agree to the byte), and the reader weighs it by its size.
        if spec.unit == "MiB" and not result.identical:
            size = (mean_a - mean_b) * spec.scale
            percent = 100 * (result.value - 1)
            size_said = minus(f"{size:+,.{spec.decimals}f} {spec.unit}, {percent:+.1f}%")
            seeds = "; ".join(filter(None, (size_said, seeds)))
    else:
        value, interval = points_strings(result)
    return Compared(
        value,
        result.verdict(spec.more, spec.less, unit),
        spec.label,
        "ratio" if kind == "ratio" else "points",
        interval,
        means,
        seeds,
        no_range(result, unit),
        extra,
        unchanged,
        result=result,
    )


@dataclass(frozen=True)
class Ratio:
    """A ratio as every answer writes it: `figure` is '0.82× (0.75–0.89×; <means>)', `value`
    and `inside` its two parts, the interval with the decimals that tell its ends apart and
    from 1; `judge` gives its verdict (the one rule)."""

    result: quantities.Comparison
    value: str
    inside: str
    unit: str  # what the noise is over: "seed" or "repeat"
    interval: str | None = None  # '0.75–0.89×', None without one

    @property
    def figure(self) -> str:
        return f"{self.value} ({self.inside})"

    @property
    def inside_brief(self) -> str:
        """`inside` as the report shows it first: the interval, the means one click away; where
        it has no range, the means and why stay (they are all it has)."""
        # (no_range is None only with an interval, and `of` writes it then)
        return cast(str, self.interval) if no_range(self.result, self.unit) is None else self.inside

    @property
    def brief(self) -> str:
        """The figure as the report shows it first: '0.82× (0.75–0.89×)'."""
        return f"{self.value} ({self.inside_brief})"

    @classmethod
    def of(cls, result: quantities.Comparison | None, means: str, unit: str) -> Ratio:
        """`result` (a ratio, dmls.report.quantities) with `means` as written; `unit` is what
        the interval is over ("seed", "repeat"). Values that agree to the byte on each side (a
        warm process's GPU memory) leave an interval of zero width: it is said in words, not
        printed as a range, and the verdict is the rule's (an interval that excludes 1, however
        narrow, is a finding)."""
        if result is None:
            raise NotMeasured("no value was recorded")
        value, interval = ratio_strings(result)
        return cls(result, value, inside(result, interval, means, unit), unit, interval)

    def judge(self, more: str, less: str) -> str:
        return self.result.verdict(more, less, self.unit)

    def said(self, more: str, less: str) -> str:
        return f"{self.figure}, {self.judge(more, less)}"

    def phrase(self, more: str, less: str) -> Phrase:
        """`said`, in full and in brief (dmls.report.phrases), for a special study's facts."""
        verdict = self.judge(more, less)
        return figure(f"{self.figure}, {verdict}", f"{self.brief}, {verdict}")


def fit(study: Study, metric: str, against: str) -> dict[str, Any]:
    """A least-squares line (stats.line) through the finished runs' means of `metric` (one
    point per run: its seeds are one run's replicates, and a warm process's memory repeats one
    value, so counting each seed as a point would fake the slope's precision) against the
    setting `against`: slope with its 95% interval, intercept, R², a verdict by the one rule,
    and which seeds each mean is over. Raises NotMeasured with fewer than three settings."""
    metric = resolve(study, metric)
    spec = METRICS[metric]
    said: dict[str, list[str]]
    xs, ys, said = [], [], {}
    for run in study.ok.index:
        if values(study, run, metric):
            # (every run's spec has the setting)
            xs.append(float(cast(float, flatten(study.metrics[run]["spec"]).get(against))))
            ys.append(quantities.mean(study, run, metric) * spec.scale)
            said.setdefault(seeds_said(study, run, metric), []).append(run)
    if len(set(xs)) < 3:
        raise NotMeasured(f"fewer than three {against} values measured it")
    # Along a line or not, by the one rule: the interval of a parabola's quadratic term
    # (quantities.line's bend), never a threshold on R².
    line, bend = quantities.line(xs, ys)
    slope = line.slope
    verdict = slope.verdict("grows", "falls", "run")  # (its noise: the runs' means about the line)
    linear = bend == quantities.NO_EFFECT
    if slope.finding in (quantities.MORE, quantities.LESS):
        verdict += {
            quantities.NO_EFFECT: " along a line within noise",
            quantities.TOO_FEW: " (whether along a line, three points can't tell)",
        }.get(bend, ", but not along a line")
    interval = f" (95% interval {slope.low:.3f} to {slope.high:.3f})" if slope.has_interval else ""
    counted = "; ".join(
        f"{seeds} of {', '.join(runs)}" if len(said) > 1 else f"{seeds} of each"
        for seeds, runs in said.items()
    )
    return {
        "slope": ("" if linear else "best line ")
        + minus(f"{slope.value:.3f} {spec.unit} per unit of {against}{interval}"),
        "intercept": minus(f"{line.intercept:.1f} {spec.unit}"),
        "r2": f"R² = {line.r2:.3f}",
        "verdict": verdict,
        "label": spec.label,
        "points": f"a least-squares line through the {line.n} runs' means ({counted})",
        "linear": linear,
        "finding": slope.finding,
    }


class _Fit:
    # `fit`'s fields, set from its dict.
    slope: str
    intercept: str
    r2: str
    verdict: str
    points: str
    linear: bool

    def __init__(self, fields: dict[str, Any], brief: bool = False) -> None:
        self.__dict__.update(fields)
        self.fields, self.brief = fields, brief

    def __str__(self) -> str:
        if self.brief:  # (as the Answers list gives it: the line, not how it was fitted)
            fit = "" if self.linear else f" ({self.r2})"
            return f"{self.verdict}: {self.slope} plus {self.intercept}{fit}"
        return f"{self.verdict}: {self.slope} plus {self.intercept} ({self.r2}; {self.points})"

    def briefly(self) -> _Fit:
        return _Fit(self.fields, brief=True)


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
        who, why = f"{run} {row['status']}", short_reason(row["reason"])
        raise NotMeasured(f"{who}: {why}", who, why)


def _number(value: float, spec: Metric) -> str:
    return f"{value * spec.scale:,.{spec.decimals}f}"


# What `ran` adds beyond the spec, and the spec keys that make it by definition: a study whose
# factor is one of them changes it by design (A6's batch size is the global batch's factor).
IMPLIED = {
    "global batch": {"batch_size", "grad_accum_steps"},
    "CUDA graphs captured": {"step"},
    "Linear layers in fp8": set(),
    # The processes decide it (one process trains bare under accelerate, inside DDP under
    # torchrun's code): a launcher alone does not.
    "model wrapper": {"nproc_per_node", "nodes", "sharding", "replica_threads"},
}


def also_differ(left: dict[str, Any], right: dict[str, Any], factor: Sequence[str]) -> str:
    """The keys two compared runs differ in beyond the study's factor, with both values:
    "step (graph vs eager)"; empty when they differ in nothing else."""

    def changed_by_design(key: str) -> bool:  # a factor names a key or a group ("optimizer")
        if key == "CUDA graphs captured" and left.get("step") != right.get("step"):
            return True  # (said by the step's own difference: eager captures none)
        if key in IMPLIED:
            return bool(IMPLIED[key] & set(factor))
        return key in BOOKKEEPING or any(key == f or key.startswith(f"{f}.") for f in factor)

    def both(key: str) -> str:
        a, b = left.get(key), right.get(key)
        if key == "global batch" and a and b:  # what it changes: the updates an epoch makes
            return f"{a} vs {b}: {b / a:.3g}× the steps per epoch"
        return f"{_show(a)} vs {_show(b)}"

    return ", ".join(
        f"{key} ({both(key)})"
        for key in dict.fromkeys([*left, *right])
        if not changed_by_design(key) and left.get(key) != right.get(key)
    )


# A factor the run measures as it ran: a requested precision that autocast did not apply
# (accelerate's fp16 on a CPU trains in fp32) changes nothing in what was computed.
MEASURED = {"precision": ("effective_precision", "the precision probe measured")}


def not_changed(left: dict[str, Any], right: dict[str, Any], factor: Sequence[str]) -> str:
    """Where two runs ask for different values of a factor they measure as run (`MEASURED`)
    and measured the same: "; fp16 computed in fp32 here, as fp32 did (...)", so the
    difference between them is not that factor's; empty otherwise."""
    said = []
    for key in factor:
        if key not in MEASURED:
            continue
        column, how = MEASURED[key]
        asked = flatten(left["spec"]).get(key), flatten(right["spec"]).get(key)
        measured = left.get(column), right.get(column)
        if asked[0] != asked[1] and measured[0] == measured[1] and measured[0]:
            said.append(
                f"; {asked[0]} computed in {measured[0]} here, as {asked[1]} did ({how} "
                f"{measured[0]} in both): the two ran the same arithmetic, so the difference "
                f"is not {key}'s"
            )
    return "".join(said)


def _show(value: Any) -> str:
    return "unset" if value is None else str(value)
