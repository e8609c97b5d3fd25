"""The run record: the shape of a run's metrics.json, the one place that builds it and combines
its seeds, and the one place that reads it.

The record is filled in from two sides. The rank that trains (training/results.py) measures a
seed and hands its numbers to `new_seed`, which gives them their keys; the job hands back its
seeds and its own facts (`new_job`). The supervisor (supervisor/supervise.py) fills in the
envelope through a `Builder`: what was asked (spec), where (host, Slurm, reservation), how it was
started (launch) and how it ended; `Builder.trained` adds the job's result with its seeds
combined by `combine`, the one function that combines them. Every reader (aggregation, the study
tables, figures, observations, the compare page) asks this module for a run's number rather
than combining seeds itself:

- a mean over the seeds with its 95% Student-t interval (`summary`, dmls/stats.py), for what
  varies from seed to seed: losses, accuracies, times, throughput, energy;
- GPU memory (the course's peak allocated bytes; ours beside it: what a step adds, graphs'
  pools): a mean over a warm process's seeds with its interval (`value`). A process's first
  seed pays cuDNN's autotuning (graph and compiled steps), so a mean over every seed would
  compare autotuning, not the technique; `first_seed_excess` says by how much it peaked higher;
- times and energy to a target accuracy from the seeds of a warm process (`timed_seeds`): the
  first seed of a process also pays the process's one-time warm-up in its first epoch.

The file's shape is metrics.schema.json (JSON Schema, versioned by VERSION; closed: a key it
does not declare is an error), checked when a record is written and when it is read, with the
bounds a schema can't state (`bounds`). Importing this module pulls neither torch nor pandas.
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from dmls import stats, versions
from dmls.files import read_checked, schema_validator, write_checked

if TYPE_CHECKING:
    from dmls.config.spec import RunSpec

VERSION = 4
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
# GPU memory, counted over a warm process's seeds (`counted_seeds`): the peaks, what a training
# step adds above what its GPU held as it began and that, and CUDA graphs' reserved pools.
MEMORY_METRICS = (
    "peak_gpu_mem_allocated_bytes", "peak_gpu_mem_reserved_bytes",
    "gpu_mem_before_step_bytes", "step_gpu_mem_bytes", "graph_pool_reserved_bytes",
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


def _validator() -> Any:
    return schema_validator(SCHEMA_PATH)


def problems(record: Any) -> list[str]:
    """What in `record` breaks the schema, each with where (`seeds/0/history/2/test_accuracy`);
    empty when it is a valid record of this VERSION."""
    if isinstance(record, dict) and record.get("metrics_version") != VERSION:
        return [f"metrics version {record.get('metrics_version')}, this pipeline reads {VERSION}"]
    errors = sorted(_validator().iter_errors(record), key=lambda e: list(e.absolute_path))
    found = [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]
    return found or bounds(record)


def step_memory_problem(seed: dict[str, Any]) -> str | None:
    """One GPU's allocated bytes before the step and what the step added: at most its peak."""
    held, added, peak = (cast(Any, seed.get(m)) for m in (*MEMORY_METRICS[2:4], MEMORY_METRICS[0]))
    if None in (held, added, peak) or held + added <= peak:
        return None
    return f"step_gpu_mem_bytes: {added} added to the {held} held before the step exceed the allocated peak, {peak}"  # noqa: E501


def bounds(record: dict[str, Any]) -> list[str]:
    """What a schema can't say of a valid record, each naming its key and value: no more seeds
    than the spec asks for, nor epochs; a step's memory under its peak; no more finished seeds
    than seeds (or, without seeds, than the spec asks for); no mean, and no epoch of the mean
    history, over more seeds than finished."""
    spec, seeds = record["spec"], record.get("seeds")
    asked, epochs = spec.get("seeds"), spec.get("epochs")
    found = []
    if seeds is not None and isinstance(asked, int) and len(seeds) > asked:
        found.append(f"seeds: {len(seeds)} seeds, but the spec asks for {asked}")
    for k, seed in enumerate(seeds or []):
        if isinstance(epochs, int) and (done := seed["final"]["epochs_completed"]) > epochs:
            found.append(
                f"seeds/{k}/final/epochs_completed: {done}, but the spec asks for {epochs}"
            )
        if problem := step_memory_problem(seed):
            found.append(f"seeds/{k}/{problem}")
    if (summary := record.get("summary")) is None:
        return found
    n_finished = summary["n_finished"]
    if seeds is not None and n_finished > len(seeds):
        found.append(f"summary/n_finished: {n_finished} of {len(seeds)} seeds")
    elif isinstance(asked, int) and n_finished > asked:
        found.append(f"summary/n_finished: {n_finished}, but the spec asks for {asked} seeds")
    for metric, estimate in summary.items():
        if isinstance(estimate, dict) and estimate["n"] > n_finished:
            found.append(
                f"summary/{metric}/n: {estimate['n']}, more than the {n_finished} seeds that "
                "finished"
            )
    for k, row in enumerate(record.get("history") or []):
        if row["n_seeds"] > n_finished:
            found.append(
                f"history/{k}/n_seeds: {row['n_seeds']}, more than the {n_finished} seeds that "
                "finished"
            )
    return found


def rebuild_hint(path: Path) -> str:
    return f"rebuild that run: snakemake --forcerun {path}"


def read(path: Path) -> dict[str, Any]:
    """One run's metrics.json (an earlier version's read as this one: dmls/versions.py), checked
    against the schema; RecordError names the file, what is wrong (the first three problems) and
    the command that writes it again."""
    return read_checked(path, problems, RecordError, rebuild_hint(path), versions.metrics_v3_as_v4)


def write(path: Path, record: dict[str, Any]) -> None:
    """Write `record` atomically once it passes the schema (files.write_checked)."""
    write_checked(path, record, problems, RecordError)


# --- Building the record ---------------------------------------------------------------------


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def steady(per_epoch: Sequence[float]) -> float | None:
    """The steady epoch's value: the median of epochs 2..E (None with fewer than two epochs:
    every epoch there was also a warm-up)."""
    return statistics.median(per_epoch[1:]) if len(per_epoch) > 1 else None


def epoch_times(history: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """The first epoch's training seconds, and the steady epoch's (`steady`)."""
    seconds = [h["train_time_s"] for h in history]
    return {"first_epoch_s": seconds[0] if seconds else None, "steady_epoch_s": steady(seconds)}


def throughput(n_train: int, epochs: Mapping[str, float | None]) -> float | None:
    """Training samples per second of the steady epoch (of the only epoch, when there is one).
    Not over the whole training: its first epoch pays the warm-up (graph capture, compiling),
    mostly in a job's first seed, so an interval over the seeds would measure the warm-up, not
    the run (docs/performance.md, "The first seed's warm-up")."""
    seconds = epochs["steady_epoch_s"] or epochs["first_epoch_s"]
    return n_train / seconds if seconds else None


def _step_memory(step_memory: Sequence[tuple[int, int, int]]) -> dict[str, int | None]:
    """What a step adds and what its GPU held as it began, of the GPU whose steps added most (so
    at most its peak together); CUDA graphs' pools apart, the most on any GPU."""
    held, added, _ = max(step_memory, key=lambda memory: memory[1], default=(None,) * 3)
    pool = max((pool for *_, pool in step_memory), default=None)
    return dict(zip(MEMORY_METRICS[2:], (held, added, pool), strict=True))


def new_seed(
    seed: int,
    outcome: Mapping[str, Any],
    *,
    n_train: int,
    setup_s: float,
    fit_s: float,
    peaks: Sequence[tuple[int, int]],
    step_memory: Sequence[tuple[int, int, int]],
    energy: dict[str, Any] | None,
    effective_precisions: Sequence[str],
    fp8_linear_layers: int,
    parameters: int | None,
    step: dict[str, Any],
    data: dict[str, Any],
    layers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One seed's record from `Trainer.fit`'s outcome (its status, reason, history, the epochs
    it stopped early or diverged at, resumed from, spent checkpointing) and what the rank
    measured: `peaks` every GPU's (allocated, reserved) peak during the seed, `step_memory`
    every GPU's (bytes allocated as the first step began, the steady steps' allocated peak
    above them, CUDA graphs' pools reserved but not allocated).
    The final numbers are the last epoch's, unless early stopping went back to the weights of
    the epoch with the lowest validation loss (the outcome's `restored_best`): then that
    epoch's training numbers and its weights' test numbers, measured again."""
    history = outcome["history"]
    last = history[-1] if history else {}
    if restored := outcome.get("restored_best"):
        # That epoch's row, its test numbers measured again on the restored weights.
        last = history[restored["epoch"] - 1] | restored
    epochs = epoch_times(history)
    return {
        "seed": seed,
        "status": outcome["status"],
        "reason": outcome["reason"],
        "history": history,
        "final": {
            **{m: last.get(m) for m in FINAL_METRICS[:4]},
            "best_test_accuracy": max((h["test_accuracy"] for h in history), default=None),
            "epochs_completed": len(history),
            "stopped_early_epoch": outcome["stopped_early_epoch"],
            "restored_best_epoch": restored["epoch"] if restored else None,
            "diverged_epoch": outcome["diverged_epoch"],
        },
        "resumed_from_epoch": outcome["resumed_from_epoch"],
        # Finished in an earlier attempt of the job (killed during a later seed) and kept.
        "kept": False,
        # Where the seed's seconds went: building its trainer (model, optimizer, loaders, step),
        # then the epochs (train, eval, checkpoints).
        "timing": {
            "setup_s": setup_s,
            "train_time_s": sum(h["train_time_s"] for h in history),
            "eval_time_s": sum(h["eval_time_s"] for h in history),
            "checkpoint_time_s": outcome["checkpoint_time_s"],
            "fit_s": fit_s,
            # The first epoch also pays for warm-up (cuDNN autotuning, graph capture, compiling);
            # the steady epoch, the median of the later ones, is what runs compare on.
            **epochs,
            "samples_per_s": throughput(n_train, epochs),
        },
        # The largest over the job's GPUs (None on CPUs), and each GPU's, rank by rank.
        "peak_gpu_mem_allocated_bytes": max((a for a, _ in peaks), default=None),
        "peak_gpu_mem_reserved_bytes": max((r for _, r in peaks), default=None),
        "peak_gpu_mem_allocated_per_gpu_bytes": [a for a, _ in peaks],
        **_step_memory(step_memory),
        # Joules of the GPU boards, all ranks together (training/energy.py); None unmeasured.
        "energy": energy,
        "effective_precision": "/".join(sorted(set(effective_precisions))),
        "fp8_linear_layers": fp8_linear_layers,
        # The model's parameters (whole, however the strategy shards them): what DDP
        # all-reduces per step is 4 bytes each (A5's prediction from the collectives sweep).
        "parameters": parameters,
        "layers": layers,  # the model layer by layer as it ran (models.describe)
        "step": step,
        # The prepared data's identity (its arrays' SHA-256) and sizes: runs compare only on
        # the same.
        "data": data,
    }


def new_job(
    seeds: list[dict[str, Any]],
    *,
    times: Mapping[str, float],
    world_size: int,
    ranks: list[dict[str, Any]],
    energy: dict[str, Any],
) -> dict[str, Any]:
    """What a job hands back (rank 0, through protocol.RESULT): every seed's record
    (`new_seed`), how the job's own seconds went, and where its ranks ran. `times` holds
    perf_counter stamps: `start`, `joined` (the process group), `fit_start` (the first seed's
    trainer built), `fit_end` (the last seed done) and `end`; the worker adds `import_s`.
    `combine` makes the run's numbers of it."""
    return {
        "seeds": seeds,
        # Where the job's seconds went, in order: joining the process group, loading the data
        # and building the first seed's trainer (setup); the seeds' epochs and the later seeds'
        # trainers (fit); gathering the results, saving and leaving the group (teardown).
        "timing": {
            "setup_s": times["fit_start"] - times["start"],
            "process_group_s": times["joined"] - times["start"],  # of setup: NCCL's init
            "fit_s": times["fit_end"] - times["fit_start"],
            "teardown_s": times["end"] - times["fit_end"],
            "wall_time_s": times["end"] - times["start"],
        },
        "world_size": world_size,
        "ranks": ranks,
        "energy": energy,
    }


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
    """Each seed's value of `metric` (seeds.csv; what is compared is `counted_values`)."""
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


# What a process's first seed inflates with what the process does once (cuDNN's autotuning and
# its workspaces, loading kernels, compile caches): GPU memory, and the time and energy to a
# target accuracy (TO_TARGET). They are compared over the seeds of a warm process.
TO_TARGET = "to_target"
WARM_METRICS = (*MEMORY_METRICS, TO_TARGET)


def counted_seeds(record: dict[str, Any], metric: str) -> list[int]:
    """The one rule for which seeds a quantity of the run is counted over (its mean, interval
    and every comparison): the seeds that finished `ok` (a diverged seed's last numbers would
    pull the run's accuracy toward chance); for `WARM_METRICS`, those of them that trained in
    a warm process (`warm_seeds`), where the job has any. A job of one seed, or whose every
    seed started a process, pays the warm-up in each: then all its finished seeds count."""
    finished = [k for k, seed in enumerate(record["seeds"]) if seed["status"] == "ok"]
    if metric not in WARM_METRICS:
        return finished
    warm = [k for k in warm_seeds(record) if k in finished]
    return warm or finished


def counted_values(record: dict[str, Any], metric: str, rule: str | None = None) -> list[float]:
    """The finite values of `metric` in the `counted_seeds` (of `rule`'s metric where given:
    the energy over the training, counted as the time to a target is)."""
    seeds = counted_seeds(record, rule or metric)
    values = (seed_value(record["seeds"][k], metric) for k in seeds)
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def first_seed_excess(seeds: list[dict[str, Any]], metric: str) -> float | None:
    """The one definition of how much more a process's first seed measured: the mean of
    `metric` over the finished seeds that started a process (`warm_seeds`' complement: the
    first of each process, kept ones included) minus its mean over the seeds `counted_seeds`
    counts; None where those are not warm seeds (every seed counts) or a side has no value."""
    record = {"seeds": seeds}
    warm, counted = set(warm_seeds(record)), counted_seeds(record, metric)
    if not warm or not set(counted) <= warm:
        return None
    cold = [k for k, seed in enumerate(seeds) if k not in warm and seed["status"] == "ok"]
    cold_values = [v for k in cold if (v := seed_value(seeds[k], metric)) is not None]
    warm_values = counted_values(record, metric)
    if not cold_values or not warm_values:
        return None
    return statistics.fmean(cold_values) - statistics.fmean(warm_values)


def timed_seeds(record: dict[str, Any]) -> list[int]:
    """The seeds whose time and energy to a target are compared (`counted_seeds` of TO_TARGET).

    The first seed of a process also pays, in its first epoch, what the process does once:
    cuDNN's autotuning, loading kernels, compile caches; a job of one seed pays it in every
    seed alike. Seeds of a warm process compare like with like."""
    return counted_seeds(record, TO_TARGET)


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


def combine(job: dict[str, Any]) -> dict[str, Any]:
    """The one place a job's seeds are combined: how the run ended (diverged when a seed did,
    and which), the seconds its fresh seeds took, the precisions its layers really ran, what
    every seed shares (the step, the data, the model's size), and the run's numbers: `summary`
    (means and intervals; GPU memory is counted from the seeds, `value`), the mean `final` and
    the mean `history`.
    A seed kept from an earlier attempt trained in another process: its seconds are not this
    job's."""
    seeds = job["seeds"]
    fresh = [s for s in seeds if not s["kept"]]
    diverged = [s for s in seeds if s["status"] != "ok"]
    first = seeds[0]
    means = summary(seeds)
    final = {m: (means[m] or {}).get("mean") for m in FINAL_METRICS}
    final |= {
        "stopped_early_epochs": [s["final"]["stopped_early_epoch"] for s in seeds],
        "diverged_epochs": [s["final"]["diverged_epoch"] for s in seeds],
    }
    sums = ("train_time_s", "eval_time_s", "checkpoint_time_s")
    return (
        job
        | {
            "status": "diverged" if diverged else "ok",
            "reason": "; ".join(
                s["reason"] if len(seeds) == 1 else f"seed {s['seed']}: {s['reason']}"
                for s in diverged
            )
            or None,
            "timing": job["timing"]
            | {key: sum(s["timing"][key] for s in fresh) for key in sums}
            # Building the trainers of the seeds after the first (part of fit).
            | {"seed_setup_s": sum(s["timing"]["setup_s"] for s in seeds[1:] if not s["kept"])},
            "effective_precision": "/".join(
                sorted({p for s in seeds for p in s["effective_precision"].split("/") if p})
            ),
            "fp8_linear_layers": first["fp8_linear_layers"],
            "parameters": first.get("parameters"),  # (None in a seed kept from an older version)
            "layers": first.get("layers"),
            "step": first["step"],
            "data": first["data"],
            "summary": means,
            "final": final,
            "history": mean_history(seeds),
        }
    )


class Builder:
    """A run's record as the supervisor fills it in, in the order it learns it: what was asked
    and where (`__init__`), the Slurm job, the cores and GPUs it reserved, how it was launched,
    how the launchers exited; then how it ended: `ended` (skipped, failed) or `trained` (the
    job's result, combined). `finish` stamps and writes it."""

    def __init__(
        self, spec: RunSpec, *, device: str, host: dict[str, Any], nodes_emulated: bool
    ) -> None:
        self.record: dict[str, Any] = {
            "metrics_version": VERSION,
            "study": spec.study,
            "run": spec.run,
            "spec": spec.to_dict(),
            "derived": {
                "processes": spec.processes,
                "replicas": spec.replicas,
                "global_batch_size": spec.global_batch_size,
                "device": device,
                "nodes_emulated": nodes_emulated,
            },
            "host": host,
            "slurm": None,
            "started_at": now(),
        }

    def slurm(self, job_id: str, nodes: Sequence[str], *, nodes_emulated: bool) -> None:
        self.record["slurm"] = {"job_id": job_id, "nodes": list(nodes)}
        self.record["derived"]["nodes_emulated"] = nodes_emulated

    def reserved(self, reservation: dict[str, Any]) -> None:
        """The GPUs and cores a local run held (supervisor/slots.py)."""
        self.record["reserved"] = reservation

    def launched(
        self,
        commands: Sequence[Any],
        *,
        threads: int,
        isolation: str,
        load_average_before: Sequence[float],
        fault: str | None,
        runtime: Mapping[str, Any],
    ) -> None:
        """How the run was started: each launcher command's argv and environment, the threads
        it may use, what it shared with other jobs (config `isolation`), the host's load as it
        began, the fault drill it got, the config's `runtime`."""
        self.record["launch"] = {
            "commands": [c.argv for c in commands],
            "env": [c.env for c in commands],
            "threads": threads,
            "isolation": isolation,
            "load_average_before": list(load_average_before),
            "fault": fault,
            "runtime": dict(runtime),
        }

    def exited(self, exit_codes: Sequence[int], seconds: float) -> None:
        self.record["launch"] |= {"exit_codes": list(exit_codes), "seconds": seconds}

    def ended(self, status: str, reason: str) -> dict[str, Any]:
        """The record of a run that did not train: skipped or failed, and why."""
        return self.record | {"status": status, "reason": reason}

    def trained(self, job: dict[str, Any]) -> dict[str, Any]:
        """The record of a run that trained: the job's result (`new_job`), combined."""
        return self.record | combine(job)


def finish(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Stamp the record's end and write it (`write`)."""
    record["finished_at"] = now()
    write(path, record)
    return record


def value(record: dict[str, Any], metric: str) -> tuple[float | None, float | None]:
    """The run's number for a `SEED_METRICS` metric and its interval's half-width (None
    without one): the mean over its `counted_seeds` (the summary's, for the metrics it holds)."""
    if metric in MEMORY_METRICS:
        estimate = stats.mean_interval(counted_values(record, metric))
        return (None, None) if estimate is None else (estimate.mean, estimate.half_width)
    entry = record["summary"].get(metric) or {}
    return entry.get("mean"), entry.get("ci95")


def per_gpu_peaks(record: dict[str, Any]) -> list[float] | None:
    """Each GPU's peak allocated bytes, counted as `value` counts memory (None: not per GPU)."""
    seeds = [record["seeds"][k] for k in counted_seeds(record, MEMORY_METRICS[0])]
    per_gpu = [seed.get("peak_gpu_mem_allocated_per_gpu_bytes") for seed in seeds]
    if not per_gpu or any(not p or len(p) != len(per_gpu[0]) for p in per_gpu):
        return None
    return [statistics.fmean(gpu) for gpu in zip(*per_gpu, strict=True)]
