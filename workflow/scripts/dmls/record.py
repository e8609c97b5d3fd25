"""The run record: the shape of a run's metrics.json, and the one place that combines its seeds.

A job trains every seed of a run in one process (training/job.py) and hands back each seed's
result; `combine` adds what the run says as a whole, and every reader (aggregation, the study
tables, figures, observations, the compare page) asks this module for a run's number rather
than combining seeds itself:

- a mean over the seeds with its 95% Student-t interval (`summary`, dmls/stats.py), for what
  varies from seed to seed: losses, accuracies, times, throughput, energy;
- peak GPU memory: one seed's, the lowest peak (`warm_peak`), with no interval. Memory has no
  seed noise: it depends on the process a seed trains in. The first seed of a process pays
  cuDNN's autotuning (graph and compiled steps), the later ones reuse its plans, so a mean over
  seeds would mix the two and the largest seed would compare autotuning, not the technique;
- times and energy to a target accuracy from the seeds of a warm process (`timed_seeds`): the
  first seed of a process also pays the process's one-time warm-up in its first epoch.

The file's shape is metrics.schema.json (JSON Schema, versioned by VERSION), checked when a
record is written and when it is read. Importing this module pulls neither torch nor pandas.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

from dmls import stats
from dmls.files import atomic_write, json_text, read_json

VERSION = 3
SCHEMA_PATH = Path(__file__).with_name("metrics.schema.json")
# The statuses of a run that trained (with seeds and numbers); the others carry a reason only.
RAN = ("ok", "diverged")

# What `summary` holds, by where a seed's result keeps it.
FINAL_METRICS = (
    "train_loss", "train_accuracy", "test_loss", "test_accuracy", "best_test_accuracy",
    "epochs_completed",
)  # fmt: skip
TIMING_METRICS = ("train_time_s", "first_epoch_s", "steady_epoch_s", "samples_per_s")
# The GPUs' joules (training/energy.py), where measured.
ENERGY_METRICS = ("train_energy_j", "eval_energy_j", "steady_epoch_energy_j")
SUMMARY_METRICS = (*FINAL_METRICS, *TIMING_METRICS, *ENERGY_METRICS)
# GPU memory, from one seed (`warm_peak`), not a mean: the peak, what a training step adds above
# what the GPUs held as it began (the memory that grows with the batch), and that.
MEMORY_METRICS = (
    "peak_gpu_mem_allocated_bytes", "peak_gpu_mem_reserved_bytes",
    "gpu_mem_before_step_bytes", "step_gpu_mem_bytes",
)  # fmt: skip
SEED_METRICS = (*SUMMARY_METRICS, *MEMORY_METRICS)
# A seed's history, one row per epoch (history.csv adds the seed); val_* only in runs with a
# validation split (`validation_samples`).
HISTORY_COLUMNS = (
    "epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "test_loss",
    "test_accuracy", "train_time_s", "eval_time_s", "lr", "train_energy_j", "eval_energy_j",
)  # fmt: skip
# The per-epoch columns averaged over seeds, and those drawn with their spread.
HISTORY_METRICS = HISTORY_COLUMNS[1:]
HISTORY_SPREAD = (
    "train_loss", "train_accuracy", "val_loss", "val_accuracy", "test_loss", "test_accuracy",
)  # fmt: skip


class RecordError(ValueError):
    """A metrics.json that can't be read; the message names it and how to rebuild it."""


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def problems(record: Any) -> list[str]:
    """What in `record` breaks the schema, each with where (`seeds/0/history/2/test_accuracy`);
    empty when it is a valid record of this VERSION."""
    if isinstance(record, dict) and record.get("metrics_version") != VERSION:
        return [f"metrics version {record.get('metrics_version')}, this pipeline reads {VERSION}"]
    errors = sorted(_validator().iter_errors(record), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]


def rebuild_hint(path: Path) -> str:
    return f"rebuild that run: snakemake --forcerun {path}"


def read(path: Path) -> dict[str, Any]:
    """One run's metrics.json, checked against the schema; RecordError names the file, what is
    wrong (the first three problems) and the command that writes it again."""
    try:
        record = read_json(path)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise RecordError(
            f"{path} is not valid JSON ({e}): cut short or changed; {rebuild_hint(path)}"
        ) from e
    if found := problems(record):
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        raise RecordError(f"{path}: {'; '.join(found[:3])}{more}; {rebuild_hint(path)}")
    return record


def write(path: Path, record: dict[str, Any]) -> None:
    """Write `record` atomically once it passes the schema, as stored (NaN and infinities as
    null): a bug in a writer fails its job rather than a report later."""
    text = json_text(record)
    if found := problems(json.loads(text)):
        raise RecordError(f"{path}: the record to write breaks its schema: {'; '.join(found[:3])}")
    atomic_write(path, lambda f: f.write(text.encode()))


# --- One seed ------------------------------------------------------------------------------


def seed_value(seed: dict[str, Any], metric: str) -> float | None:
    """One seed's value of a `SEED_METRICS` metric (None where it has none: energy unmeasured,
    GPU memory on a CPU)."""
    if metric in FINAL_METRICS:
        return seed["final"][metric]
    if metric in TIMING_METRICS:
        return seed["timing"][metric]
    if metric in ENERGY_METRICS:
        return (seed.get("energy") or {}).get(metric)
    return seed.get(metric)  # (a step's memory: not in a seed written before StepMemory)


def steady_epochs(seed: dict[str, Any]) -> list[float]:
    """The training seconds of a seed's epochs 2..E (the first also pays the warm-up)."""
    return [row["train_time_s"] for row in seed["history"][1:]]


# --- Which seeds -----------------------------------------------------------------------------


def seed_count(record: dict[str, Any]) -> int:
    """How many seeds the run trained (0 for one that did not train)."""
    return len(record.get("seeds") or [])


def seed_values(record: dict[str, Any], metric: str) -> list[float | None]:
    """Each seed's value of `metric`, what the run's intervals and comparisons come from."""
    return [seed_value(seed, metric) for seed in record["seeds"]]


def fresh_seeds(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The seeds this job's process trained, in order: a kept seed trained in an earlier,
    killed process (`kept`)."""
    return [seed for seed in record["seeds"] if not seed["kept"]]


def warm_seeds(record: dict[str, Any]) -> list[int]:
    """Indices of the seeds that trained in a process that had trained an earlier seed: all but
    the first of each process (a job killed and run again starts a new one: its kept seeds came
    from the earlier process, the first seed it trains is cold)."""
    seeds = record["seeds"]
    return [k for k in range(1, len(seeds)) if seeds[k]["kept"] == seeds[k - 1]["kept"]]


def timed_seeds(record: dict[str, Any]) -> list[int]:
    """Indices of the seeds whose time and energy to a target are compared: those of a warm
    process where the job has any, else every seed (one seed: it paid the warm-up).

    The first seed of a process also pays, in its first epoch, what the process does once:
    cuDNN's autotuning, loading kernels, compile caches; a job of one seed pays it in every
    seed alike. Seeds of a warm process compare like with like."""
    return warm_seeds(record) or list(range(len(record["seeds"])))


def timed_values(record: dict[str, Any], metric: str) -> list[float | None]:
    """`seed_values` of the `timed_seeds`."""
    values = seed_values(record, metric)
    return [values[k] for k in timed_seeds(record)]


# --- Seeds combined --------------------------------------------------------------------------


def finished(seeds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The seeds that finished `ok`: only they enter a mean (a diverged seed's last numbers
    would pull the run's accuracy toward chance)."""
    return [seed for seed in seeds if seed["status"] == "ok"]


def summary(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per `SUMMARY_METRICS` metric: mean, n, std and the 95% interval over the seeds that
    finished (`finished`; None where none has a finite value; for the energy, where any seed
    has none: a mean over the seeds whose epochs the counter resolved would favour the slow
    ones). `n_finished` says how many seeds that is."""
    seeds = finished(seeds)
    out: dict[str, Any] = {"confidence": stats.CONFIDENCE, "n_finished": len(seeds)}
    for metric in SUMMARY_METRICS:
        values = [seed_value(s, metric) for s in seeds]
        if metric in ENERGY_METRICS and None in values:
            values = []
        estimate = stats.mean_interval(values)
        out[metric] = None if estimate is None else estimate.to_dict()
    return out


def warm_peak(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's peak GPU memory: the seed with the lowest allocated peak (a warm process's) and
    its peaks, each GPU's too, so that the run's largest and per-GPU numbers come from the same
    seed; and how far the first seed its process trained peaked above the later ones."""
    metric = MEMORY_METRICS[0]
    measured = [k for k, s in enumerate(seeds) if s.get(metric) is not None]
    best = min(measured, key=lambda k: seeds[k][metric], default=None)
    chosen = seeds[best] if best is not None else {}
    fresh = [s[metric] for s in seeds if not s["kept"] and s.get(metric) is not None]
    return {
        "seed": None if best is None else chosen["seed"],
        **{m: chosen.get(m) for m in MEMORY_METRICS},
        "peak_gpu_mem_allocated_per_gpu_bytes": chosen.get("peak_gpu_mem_allocated_per_gpu_bytes"),
        "first_seed_excess_bytes": fresh[0] - min(fresh[1:]) if len(fresh) > 1 else None,
    }


def mean_history(seeds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per epoch, the mean over the finished seeds that reached it (early stopping ends seeds
    at different epochs; `n_seeds` says how many) and the 95% half-width of the losses and
    accuracies (None with one seed)."""
    by_epoch: dict[int, list[dict[str, Any]]] = {}
    for seed in finished(seeds):
        for row in seed["history"]:
            by_epoch.setdefault(row["epoch"], []).append(row)
    history = []
    for epoch, rows in sorted(by_epoch.items()):
        entry: dict[str, Any] = {"epoch": epoch, "n_seeds": len(rows)}
        for metric in HISTORY_METRICS:
            estimate = stats.mean_interval([r.get(metric) for r in rows])
            entry[metric] = None if estimate is None else estimate.mean
            if metric in HISTORY_SPREAD:
                entry[f"{metric}_ci95"] = None if estimate is None else estimate.half_width
        history.append(entry)
    return history


def timed_history(record: dict[str, Any]) -> list[dict[str, Any]]:
    """`mean_history` of the `timed_seeds` (the accuracy-against-time figure)."""
    return mean_history([record["seeds"][k] for k in timed_seeds(record)])


def combine(result: dict[str, Any]) -> dict[str, Any]:
    """The job's result with its seeds combined: `summary`, `memory`, the mean `final` and the
    mean `history`."""
    seeds = result["seeds"]
    means = summary(seeds)
    final = {m: (means[m] or {}).get("mean") for m in FINAL_METRICS}
    final |= {
        "stopped_early_epochs": [s["final"]["stopped_early_epoch"] for s in seeds],
        "diverged_epochs": [s["final"]["diverged_epoch"] for s in seeds],
    }
    return result | {
        "summary": means,
        "memory": warm_peak(seeds),
        "final": final,
        "history": mean_history(seeds),
    }


def value(record: dict[str, Any], metric: str) -> tuple[float | None, float | None]:
    """The run's number for a `SEED_METRICS` metric and its interval's half-width (None
    without one): the mean over seeds, or for memory the warm peak."""
    if metric in MEMORY_METRICS:
        return record["memory"].get(metric), None  # (a step's: not in records before StepMemory)
    estimate = record["summary"].get(metric) or {}
    return estimate.get("mean"), estimate.get("ci95")


def per_gpu_peaks(record: dict[str, Any]) -> list[int] | None:
    """Each GPU's peak allocated bytes in the seed `warm_peak` chose."""
    return record["memory"]["peak_gpu_mem_allocated_per_gpu_bytes"]


# --- Time and energy to a target accuracy ----------------------------------------------------


def time_to_target(
    history: list[dict[str, Any]], target: float
) -> tuple[float, int, float | None] | None:
    """(seconds, epochs, joules) until the first epoch whose test accuracy reaches `target`:
    the training and evaluation time of the epochs up to it (the job's launch and setup are not
    counted, as MLPerf's time-to-train starts with the run), and the GPUs' energy in them
    (None unmeasured). None when no epoch reaches it."""
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
    record: dict[str, Any], target: float
) -> list[tuple[float, int, float | None] | None]:
    """Each seed's (seconds, epochs, joules) to `target`, None where it never got there."""
    return [time_to_target(seed["history"], target) for seed in record["seeds"]]


def to_target(record: dict[str, Any], target: float) -> dict[str, Any]:
    """A run's time, epochs and energy to `target`: mean and 95% interval, numbers only when
    every seed reached it; time and energy over the `timed_seeds`, epochs over every seed; and
    how many seeds got there."""
    reached = seeds_to_target(record, target)
    hits = [r for r in reached if r is not None]
    row: dict[str, Any] = {"seeds_to_target": f"{len(hits)} of {len(reached)}"}
    if len(hits) == len(reached):
        timed = timed_seeds(record)
        row["seeds_timed_to_target"] = len(timed)
        for i, column in enumerate(("time_to_target_s", "epochs_to_target", "energy_to_target_j")):
            values = [hits[k][i] for k in (range(len(hits)) if i == 1 else timed)]
            if None not in values:  # (energy: None in a seed where it was not measured)
                estimate = stats.mean_interval(values)
                row |= {column: estimate.mean, f"{column}_ci95": estimate.half_width}
    return row


def timed_to_target(record: dict[str, Any], target: float, part: int) -> list[float] | None:
    """Each timed seed's seconds (`part` 0) or joules (2) to `target`, None unless every seed
    reached it with that part measured (what the time-to-accuracy comparisons come from)."""
    reached = seeds_to_target(record, target)
    if None in reached:
        return None
    values = [reached[k][part] for k in timed_seeds(record)]
    return None if None in values else values


def cold_excess_to_target(record: dict[str, Any], target: float) -> float | None:
    """How much longer the job's cold seeds (each process's first) took to `target` than its
    warm ones, in seconds; None when a seed missed it or the job has no warm seed."""
    reached = seeds_to_target(record, target)
    warm = warm_seeds(record)
    if None in reached or not warm:
        return None
    cold = [k for k in range(len(reached)) if k not in warm]
    cold_s = [reached[k][0] for k in cold]
    warm_s = [reached[k][0] for k in warm]
    return sum(cold_s) / len(cold_s) - sum(warm_s) / len(warm_s)


def warm_energy(record: dict[str, Any]) -> stats.Estimate | None:
    """The GPUs' energy over the training in the `timed_seeds` (the first seed of a process
    also pays its warm-up, as it does to the target accuracy); None where a seed lacks it."""
    values = timed_values(record, "train_energy_j")
    return None if None in values else stats.mean_interval(values)
