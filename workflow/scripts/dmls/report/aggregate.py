"""Collect every run's metrics.json into one table (results/runs.csv: one row per run, each
number the mean over the run's seeds with its 95% interval's half-width in `<column>_ci95`, but
peak GPU memory, the lowest of its seeds' peaks: `job_peaks`) and one per seed
(results/seeds.csv)."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import pandas as pd

from dmls.files import atomic_write, read_json
from dmls.report.cells import joined
from dmls.supervisor.repeats import MEMORY_METRICS, SUMMARY_METRICS, seed_value
from dmls.supervisor.supervise import METRICS_VERSION

# Leading columns, in this order; every spec key follows as a `spec.`-prefixed column.
SUMMARY_COLUMNS = [
    "study", "run", "status", "reason", "data_synthetic", "device", "effective_precision",
    "step_mode", "step_eager_reason", "processes", "replicas", "global_batch_size",
    "nodes_emulated", "epochs_completed",
    "train_loss", "train_accuracy", "test_loss", "test_accuracy", "best_test_accuracy",
    "train_time_s", "first_epoch_s", "steady_epoch_s", "wall_time_s", "samples_per_s",
    "peak_gpu_mem_allocated_bytes",
    "peak_gpu_mem_reserved_bytes", "peak_host_rss_bytes",
    "train_energy_j", "eval_energy_j", "steady_epoch_energy_j", "energy_reason",
    "gpu_names", "hostnames",
    "slurm_job_id", "seeds",
    *(f"{m}_ci95" for m in SUMMARY_METRICS),
]  # fmt: skip
# The per-seed table's columns after study, run and seed.
SEED_COLUMNS = ["status", "reason", "kept", *SUMMARY_METRICS]


def summarize(metrics: dict[str, Any]) -> dict[str, Any]:
    """One row: what was run, how it ended and its final numbers (none unless it ran)."""
    row: dict[str, Any] = {
        "study": metrics["study"],
        "run": metrics["run"],
        "status": metrics["status"],
        "reason": metrics.get("reason"),
        **metrics["derived"],
        "slurm_job_id": (metrics.get("slurm") or {}).get("job_id"),
    }
    ran = metrics["status"] in ("ok", "diverged")
    if ran:
        ranks = metrics["ranks"]
        gpus = [g for r in ranks for g in r["gpus"]]
        step = metrics["step"]
        summary = metrics["summary"]
        estimates = {m: summary[m] or {} for m in SUMMARY_METRICS}
        row |= {m: e.get("mean") for m, e in estimates.items()}
        row |= {f"{m}_ci95": e.get("ci95") for m, e in estimates.items()}
        row |= job_peaks(metrics["seeds"])
        row |= {
            "data_synthetic": metrics["data"]["synthetic"],
            "effective_precision": metrics["effective_precision"],
            # How the steps really ran (dmls/training/steps.py): "cuda_graph", with "+compile"
            # when compiled, or "eager" and why.
            "step_mode": step["mode"] + ("+compile" if step["compiled"] else ""),
            "step_eager_reason": step["eager_reason"],
            "seeds": summary["seeds"],
            # The job's, all seeds together.
            "wall_time_s": metrics["timing"]["wall_time_s"],
            "peak_host_rss_bytes": max(r["peak_host_rss_bytes"] for r in ranks),
            "gpu_names": ";".join(sorted({g["name"] for g in gpus})) or None,
            "hostnames": ";".join(sorted({r["hostname"] for r in ranks})),
            # Why the energy columns are empty (a CPU run, no NVML), where they are.
            "energy_reason": (metrics.get("energy") or {}).get("reason"),
        }
    spec = pd.json_normalize(metrics["spec"], sep=".").iloc[0].to_dict()
    row |= {f"spec.{k}": joined(v) for k, v in spec.items() if k not in ("study", "run")}
    return row


def job_peaks(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's peak GPU memory in a warm process: the lowest of its seeds' peaks, with no
    interval.

    Memory has no seed noise: a seed's peak depends on the process it trains in, not on its
    seed. The first seed of a process pays cuDNN's autotuning (`cudnn.benchmark`, on for graph
    and compiled steps): each new shape tries several algorithms, each with its workspace, and
    the later seeds reuse the tuned plans. bench/seed_memory.py shows it in one process: the
    course CNN at batch 32 peaked at 142.9 MiB in its first seed and 86.6 MiB in the next two
    with autotuning on, 86.6 MiB in all three with it off (1x H200, torch 2.11). A mean over the
    seeds with a Student-t interval mixes the two (the example report's ddp_2gpu: 220.9 ± 63.8
    MiB from 250.6, 206.1 and 206.1), and the largest seed compares autotuning's trials, not
    the technique studied (fp32 peaked 44 MiB above bf16 in its first seed, 0.3 MiB below it in
    the later ones). So a run's number is its warm peak; the report says by how much each
    job's first seed peaked above it (observations.memory_per_job), and seeds.csv keeps each
    seed's. A run of one seed has only its first seed's peak, autotuning included."""
    peaks = {}
    for metric in MEMORY_METRICS:
        values = [v for v in (seed_value(s, metric) for s in seeds) if v is not None]
        peaks[metric] = min(values, default=None)
        peaks[f"{metric}_ci95"] = None
    return peaks


class MetricsError(ValueError):
    """A run's metrics.json that can't be read; the message names it and how to rebuild it."""


def read_metrics(path: Path) -> dict[str, Any]:
    """One run's metrics.json, or MetricsError naming the file and the command that writes it
    again (a truncated or hand-edited file would otherwise fail the report with a bare
    JSONDecodeError)."""
    rebuild = f"rebuild that run: snakemake --forcerun {path}"
    try:
        metrics = read_json(path)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise MetricsError(
            f"{path} is not valid JSON ({e}): cut short or changed; {rebuild}"
        ) from e
    missing = [k for k in ("study", "run", "status", "derived", "spec") if k not in metrics]
    if missing:
        raise MetricsError(f"{path} lacks {', '.join(missing)}; {rebuild}")
    version = metrics.get("metrics_version")
    if version != METRICS_VERSION:
        raise MetricsError(
            f"{path} is metrics version {version}, this pipeline reads {METRICS_VERSION} (runs "
            f"with their seeds); {rebuild}"
        )
    return metrics


def collect(paths: list[Path]) -> pd.DataFrame:
    """The runs table: one row per metrics file (none configured: the columns alone)."""
    rows = [summarize(read_metrics(p)) for p in paths]
    frame = pd.DataFrame(rows, columns=None if rows else SUMMARY_COLUMNS)
    leading = [c for c in SUMMARY_COLUMNS if c in frame.columns]
    rest = [c for c in frame.columns if c not in leading]
    return frame[leading + rest].sort_values(["study", "run"], kind="stable")


def seed_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per seed of a run that trained (none for a skipped or failed run)."""
    if metrics["status"] not in ("ok", "diverged"):
        return []
    return [
        {"study": metrics["study"], "run": metrics["run"], "seed": seed["seed"]}
        | {k: seed[k] for k in ("status", "reason", "kept")}
        | {m: seed_value(seed, m) for m in SUMMARY_METRICS}
        for seed in metrics["seeds"]
    ]


def collect_seeds(paths: list[Path]) -> pd.DataFrame:
    """The per-seed table: one row per seed of every run that trained."""
    rows = [row for p in paths for row in seed_rows(read_metrics(p))]
    return pd.DataFrame(rows, columns=["study", "run", "seed", *SEED_COLUMNS])


def main_from_snakemake(snakemake: Any, log: IO[str]) -> None:
    """Entry of the `aggregate_runs` rule (workflow/scripts/aggregate_runs.py); `log` is the
    rule's log, open (dmls.joblog)."""
    paths = [Path(p) for p in snakemake.input.metrics]
    frame = collect(paths)
    atomic_write(Path(snakemake.output.table), lambda f: frame.to_csv(f, index=False))
    seeds = collect_seeds(paths)
    atomic_write(Path(snakemake.output.seeds), lambda f: seeds.to_csv(f, index=False))
    print(
        f"{len(frame)} runs: {frame['status'].value_counts().to_dict()}; {len(seeds)} seeds",
        file=log,
    )
