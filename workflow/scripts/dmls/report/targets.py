"""Time and energy to a target accuracy, read from a run's record: each seed's, and the run's
over the seeds that compare (record.timed_seeds: those of a warm process)."""

from __future__ import annotations

from typing import Any, cast

from dmls import record, stats


def time_to_target(
    history: list[dict[str, Any]], target: float
) -> tuple[float, int, float | None] | None:
    """(seconds, epochs, joules) until the first epoch whose test accuracy reaches `target`:
    the training and evaluation time of the epochs up to it (the job's launch and setup are not
    counted, as MLPerf's time-to-train starts with the run), and the GPUs' energy in them
    (None unmeasured). None when no epoch reaches it."""
    joules: float | None
    seconds, joules = 0.0, 0.0
    for epoch in history:
        seconds += epoch["train_time_s"] + epoch["eval_time_s"]
        if joules is not None and "train_energy_j" in epoch:
            joules += epoch["train_energy_j"] + epoch["eval_energy_j"]
        else:
            joules = None
        if epoch["test_accuracy"] is not None and epoch["test_accuracy"] >= target:
            return seconds, epoch["epoch"], joules
    return None


def seeds_to_target(
    run: dict[str, Any], target: float
) -> list[tuple[float, int, float | None] | None]:
    """Each seed's (seconds, epochs, joules) to `target`, None where it never got there."""
    return [time_to_target(seed["history"], target) for seed in run["seeds"]]


def to_target(run: dict[str, Any], target: float) -> dict[str, Any]:
    """A run's time, epochs and energy to `target`: mean and 95% interval, numbers only when
    every seed reached it; time and energy over the `timed_seeds`, epochs over every seed; and
    how many seeds got there."""
    reached = seeds_to_target(run, target)
    hits = [r for r in reached if r is not None]
    row: dict[str, Any] = {"seeds_to_target": f"{len(hits)} of {len(reached)}"}
    if len(hits) == len(reached):
        timed = record.timed_seeds(run)
        row["seeds_timed_to_target"] = len(timed)
        for i, column in enumerate(("time_to_target_s", "epochs_to_target", "energy_to_target_j")):
            values = [hits[k][i] for k in (range(len(hits)) if i == 1 else timed)]
            if None not in values:  # (energy: None in a seed where it was not measured)
                estimate = stats.mean_interval(values)
                assert estimate is not None  # an ok run's seeds all finished: values
                row |= {column: estimate.mean, f"{column}_ci95": estimate.half_width}
    return row


def timed_to_target(run: dict[str, Any], target: float, part: int) -> list[float] | None:
    """Each timed seed's seconds (`part` 0) or joules (2) to `target`, None unless every seed
    reached it with that part measured (what the time-to-accuracy comparisons come from)."""
    reached = seeds_to_target(run, target)
    if None in reached:
        return None
    hits = cast("list[tuple[float, int, float | None]]", reached)  # None ruled out
    values = [hits[k][part] for k in record.timed_seeds(run)]
    return None if None in values else cast("list[float]", values)


def cold_excess_to_target(run: dict[str, Any], target: float) -> float | None:
    """How much longer the job's cold seeds (each process's first) took to `target` than its
    warm ones, in seconds; None when a seed missed it or the job has no warm seed."""
    reached = seeds_to_target(run, target)
    warm = record.warm_seeds(run)
    if None in reached or not warm:
        return None
    cold = [k for k in range(len(reached)) if k not in warm]
    hits = cast("list[tuple[float, int, float | None]]", reached)  # None ruled out
    cold_s = [hits[k][0] for k in cold]
    warm_s = [hits[k][0] for k in warm]
    return sum(cold_s) / len(cold_s) - sum(warm_s) / len(warm_s)


def warm_energy(run: dict[str, Any]) -> stats.Estimate | None:
    """The GPUs' energy over the training in the `timed_seeds` (the first seed of a process
    also pays its warm-up, as it does to the target accuracy); None where a seed lacks it."""
    values = record.timed_values(run, "train_energy_j")
    return None if None in values else stats.mean_interval(values)
