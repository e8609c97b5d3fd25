"""The numbers under the report's words: every comparison, mean, interval and ratio a sentence
renders, computed here from a study's records (`Study`, `RunNumbers`) by dmls/stats.py.

The word modules (`WORD_MODULES`: answers, observations, comparisons, communication,
special_answers, wording, captions, cells) import neither dmls.stats nor dmls.record
(tests/test_layers.py): they read the objects made here, choose a case by a comparison's
`finding` (the one rule, dmls.stats.finding), never by a word, and write them. What they read
is `Comparison` (a ratio or a difference with its 95% interval) and the rule's four outcomes,
named here for them.

One convention per quantity: a speed, a memory, an energy is a ratio `run / reference` of
geometric means (> 1: more of it: faster, heavier, more energy); a time is the same ratio of
times (> 1: slower); an accuracy is a difference in points. Two runs measured on the same
seeds are compared seed by seed (stats.paired: identical in every seed reads so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from dmls import record, stats
from dmls.config.studies import flatten
from dmls.report.study import device_kind, step_taken

# The vocabulary the words read: a compared number and the one rule's four outcomes.
from dmls.stats import LESS, MORE, NO_EFFECT, TOO_FEW, Comparison, Estimate, Line  # noqa: F401

if TYPE_CHECKING:
    from dmls.report.study import Study

# The modules that write words: they render this module's objects and compute no statistic.
WORD_MODULES = (
    "answers", "observations", "comparisons", "communication", "special_answers", "wording",
    "captions", "cells", "phrases",
)  # fmt: skip

# What a metric's comparison is: an accuracy a difference (in points), anything else a ratio.
DIFFERENCES = frozenset({"test_accuracy", "val_accuracy", "train_accuracy", "steady_epoch_s"})


def kind(metric: str) -> str:
    """How `metric` is compared: "difference" for accuracies (points) and seconds of a
    backend's gap, "ratio" for everything else."""
    return "difference" if metric in DIFFERENCES else "ratio"


def warm(metric: str) -> bool:
    """Whether `metric` counts only a warm process's seeds (record.WARM_METRICS: GPU memory,
    the time to a target), so that the text names the seeds it is over."""
    return metric in record.WARM_METRICS


def noise_unit(metric: str) -> str:
    """What a comparison of `metric` has its noise over, as its words name it: "seed" where
    each seed records it, "job" where the run has one value (host RSS, the job's peak over its
    ranks)."""
    return "seed" if metric in record.SEED_METRICS else "job"


# What varies between two jobs of identical settings beyond their seeds (the machine's state as
# each ran, what else it ran beside): a speed. Two runs are two jobs, so their speeds are
# compared with that variation counted (stats.across_jobs), measured by the DAG's A/A jobs.
BETWEEN_JOBS = {"samples_per_s": stats.across_jobs, "steady_epoch_s": stats.times_across_jobs}


def compare(
    study: Study, run: str, reference: str, metric: str, other: Study | None = None
) -> Comparison | None:
    """`run` of `study` against `reference` (of `other`, where given: a run of another study or
    results folder) over the seeds each counts (Study.by_seed, record.counted_seeds): a ratio
    of geometric means or a difference of means (`kind`), seed by seed where both have the
    same seeds (stats.paired). A speed (`BETWEEN_JOBS`) of two runs, each its own job, has an
    interval that also covers how much jobs of identical settings differ (`Study.job_noise`,
    stats.across_jobs), and none where no such jobs ran. None where a side has no value."""
    theirs = other or study
    how: Callable[..., Comparison | None]
    how = stats.difference if kind(metric) == "difference" else stats.ratio
    if metric in BETWEEN_JOBS and (theirs is not study or run != reference):
        device = device_kind(study.metrics[run])
        noise = (study.job_noise or theirs.job_noise or {}).get(device)

        def how(a: Sequence[float], b: Sequence[float], confidence: float) -> Comparison | None:
            return BETWEEN_JOBS[metric](a, b, noise, confidence)

    return stats.paired(how, study.by_seed(run, metric), theirs.by_seed(reference, metric))


def ran(metrics: dict[str, Any]) -> dict[str, Any]:
    """What a run ran, as dotted keys: its spec, with `step` the step it took (a DataParallel
    run asked for a graph steps eagerly: `step` is then "eager"), and what the spec implies
    that changes training too: the global batch (half the optimizer steps per epoch at twice
    the batch), the CUDA graphs its step captured (gradient accumulation captures a second),
    the Linear layers it ran in fp8, and the wrapper its model trained in (DDP's all-reduce
    hooks cost a step even at one process)."""
    flat = flatten(metrics["spec"])
    if taken := step_taken(metrics):
        flat["step"] = taken
    step = metrics.get("step") or {}
    flat["global batch"] = metrics["derived"].get("global_batch_size")
    if step.get("mode"):  # (an eager step captures none)
        flat["CUDA graphs captured"] = step.get("graphs") if step["mode"] == "cuda_graph" else 0
    flat["Linear layers in fp8"] = metrics.get("fp8_linear_layers") or 0
    if wrapper := step.get("wrapper"):
        flat["model wrapper"] = wrapper
    return flat


# Spec keys that never make two runs' training differ.
BOOKKEEPING = frozenset({"study", "run", "seed", "seeds"})


def identical_jobs(records: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The finished runs that ran the same thing (`ran`, but their names) on the same kind of
    device of the same host, grouped: A/A jobs, two or more to a group. Seeds are not
    bookkeeping here: the same seeds make the same work."""

    def key(metrics: dict[str, Any]) -> str:
        flat = {k: v for k, v in ran(metrics).items() if k not in {"study", "run"}}
        where = (metrics["ranks"][0].get("hostname"), device_kind(metrics))
        return repr((sorted(flat.items(), key=str), where))

    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for metrics in records:
        if metrics.get("status") == "ok":
            groups.setdefault(key(metrics), {})[f"{metrics['study']}/{metrics['run']}"] = metrics
    return [list(g.values()) for g in groups.values() if len(g) >= 2]


def job_noise(*folders: Sequence[dict[str, Any]]) -> dict[str, stats.JobNoise]:
    """How much the speeds of identical jobs (`identical_jobs`, within each results folder's
    records: two folders' runs of one name are what compare.html compares, not A/A jobs)
    differed, per kind of device ("cuda", "cpu"): stats.job_noise over each job's geometric
    mean samples/s (its counted seeds); a kind without two such jobs is absent."""
    jobs = [group for records in folders for group in identical_jobs(records)]
    found = {}
    for device in ("cuda", "cpu"):
        mine = [g for g in jobs if device_kind(g[0]) == device]
        groups = [
            [stats.geometric_mean(record.counted_values(m, "samples_per_s")) for m in group]
            for group in mine
        ]
        if noise := stats.job_noise(groups):
            names = tuple(tuple(f"{m['study']}/{m['run']}" for m in group) for group in mine)
            found[device] = replace(noise, labels=names)
    return found


def between(study: Study, run: str, other: Study, metric: str) -> Comparison | None:
    """The run of the same name in two studies (B2's beside B1's): `compare` across them."""
    return compare(study, run, run, metric, other)


def mean(study: Study, run: str, metric: str) -> float:
    """The mean a comparison of `metric` divides or subtracts: the geometric mean of the
    seeds' values for a ratio (stats.ratio's), the arithmetic one for a difference."""
    values = study.seed_values(run, metric)
    return stats.geometric_mean(values) if kind(metric) == "ratio" else float(np.mean(values))


def interval(values: Sequence[float]) -> Estimate | None:
    """The mean of `values` (one per seed) with its 95% interval (stats.mean_interval)."""
    return stats.mean_interval(list(values))


def warm_against_first(study: Study, run: str) -> Comparison | None:
    """The steady epochs of a process's later seeds against its first seed's, as a ratio of
    times (> 1: later seeds slower), each epoch a sample; None with one fresh seed or no
    steady epoch."""
    seeds = record.fresh_seeds(study.metrics[run])
    if len(seeds) < 2:
        return None
    later = [t for seed in seeds[1:] for t in record.steady_epochs(seed)]
    return stats.ratio(later, record.steady_epochs(seeds[0]))


def seed_count(study: Study, run: str) -> int:
    """How many seeds `run` trained (record.seed_count)."""
    return record.seed_count(study.metrics[run])


def train_times(study: Study, run: str) -> list[float]:
    """Each timed seed's training time in seconds (record.timed_values: a warm process's)."""
    times = record.timed_values(study.metrics[run], "train_time_s")
    return [t for t in times if t is not None]


def time_to_target(study: Study, run: str, reference: str) -> Comparison | None:
    """`run`'s seconds to the study's target accuracy over `reference`'s, a ratio of times
    (> 1: slower); None where either has a seed that never reached it."""
    times = study.seconds_to_target(run), study.seconds_to_target(reference)
    return None if None in times else stats.ratio(*cast("tuple[list[float], list[float]]", times))


def energy_to_target(study: Study, run: str, reference: str) -> Comparison | None:
    """`run`'s GPU energy to the target over `reference`'s (> 1: more energy)."""
    joules = study.joules_to_target(run), study.joules_to_target(reference)
    return None if None in joules else stats.ratio(*cast("tuple[list[float], list[float]]", joules))


def ratio_of_repeats(
    reference: Sequence[float], other: Sequence[float], paired: bool = False
) -> Comparison | None:
    """A special study's timed repeats: `reference`'s time over `other`'s as a speed (> 1:
    `other` faster), repeat by repeat where the two took turns (`paired`, stats.paired_ratio:
    a drift both shared cancels), else the ratio of geometric means; None without a value."""
    how = stats.paired_ratio if paired else stats.ratio
    return how(list(reference), list(other))


def line(xs: Sequence[float], ys: Sequence[float]) -> tuple[Line, str]:
    """A least-squares line through the points (stats.line) and whether they bend away from
    it: the finding of a parabola's quadratic term (stats.curvature; NO_EFFECT: along a line
    within noise, TOO_FEW with three points)."""
    return stats.line(xs, ys), stats.curvature(xs, ys).finding
