"""Collect every run's metrics.json into one table (results/runs.csv: one row per run, each
number as dmls/record.py gives it, the mean over the run's seeds with its 95% interval's
half-width in `<column>_ci95`, or peak GPU memory from its warm seed) and one per seed
(results/seeds.csv)."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import pandas as pd

from dmls import record
from dmls.files import atomic_write
from dmls.report.cells import joined

# Leading columns, in this order; every spec key follows as a `spec.`-prefixed column.
SUMMARY_COLUMNS = [
    "study", "run", "status", "reason", "data_synthetic", "device", "effective_precision",
    "step_mode", "step_eager_reason", "processes", "replicas", "global_batch_size",
    "nodes_emulated", "epochs_completed",
    "train_loss", "train_accuracy", "test_loss", "test_accuracy", "best_test_accuracy",
    "train_time_s", "first_epoch_s", "steady_epoch_s", "wall_time_s", "samples_per_s",
    "peak_gpu_mem_allocated_bytes", "peak_gpu_mem_reserved_bytes",
    "gpu_mem_before_step_bytes", "step_gpu_mem_bytes", "graph_pool_reserved_bytes",
    "peak_host_rss_bytes",
    "train_energy_j", "eval_energy_j", "steady_epoch_energy_j", "energy_reason",
    "gpu_names", "hostnames", "onednn_bf16", "onednn_fp16", "cpu_half_flags",
    "slurm_job_id", "n_seeds", "n_seeds_finished",
    *(f"{m}_ci95" for m in record.SEED_METRICS),
]  # fmt: skip
# The per-seed table's columns after study, run and seed.
SEED_COLUMNS = ["status", "reason", "kept", *record.SEED_METRICS]


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
    if metrics["status"] in record.RAN:
        ranks = metrics["ranks"]
        gpus = [g for r in ranks for g in r["gpus"]]
        step = metrics["step"]
        for metric in record.SEED_METRICS:
            row[metric], row[f"{metric}_ci95"] = record.value(metrics, metric)
        row |= {
            "data_synthetic": metrics["data"]["synthetic"],
            "effective_precision": metrics["effective_precision"],
            # How the steps really ran (dmls/training/steps.py): "cuda_graph", with "+compile"
            # when compiled, or "eager" and why.
            "step_mode": step["mode"] + ("+compile" if step["compiled"] else ""),
            "step_eager_reason": step["eager_reason"],
            "n_seeds": record.seed_count(metrics),
            # The seeds the means are over: those that finished `ok` (not a diverged one).
            "n_seeds_finished": metrics["summary"]["n_finished"],
            # The job's, all seeds together.
            "wall_time_s": metrics["timing"]["wall_time_s"],
            "peak_host_rss_bytes": max(r["peak_host_rss_bytes"] for r in ranks),
            "gpu_names": ";".join(sorted({g["name"] for g in gpus})) or None,
            "hostnames": ";".join(sorted({r["hostname"] for r in ranks})),
            # Why the energy columns are empty (a CPU run, no NVML), where they are.
            "energy_reason": (metrics.get("energy") or {}).get("reason"),
            **half_precision_kernels(metrics),
        }
    spec = pd.json_normalize(metrics["spec"], sep=".").iloc[0].to_dict()
    row |= {f"spec.{k}": joined(v) for k, v in spec.items() if k not in ("study", "run")}
    return row


def half_precision_kernels(metrics: dict[str, Any]) -> dict[str, Any]:
    """Whether the host's oneDNN had bf16 and fp16 kernels, and which of the CPU's bf16/fp16
    instruction sets it had (supervisor/hardware.py describe); empty where the record is older
    than these facts."""
    facts = (metrics.get("host") or {}).get("cpu_half_precision") or {}
    kernels = facts.get("onednn_kernels") or {}
    flags = facts.get("flags")
    return {
        "onednn_bf16": kernels.get("bf16"),
        "onednn_fp16": kernels.get("fp16"),
        "cpu_half_flags": None if flags is None else (" ".join(flags) or "none"),
    }


def read_all(paths: list[Path]) -> list[dict[str, Any]]:
    """Every run's record, each file read and checked once (record.read), for both tables."""
    return [record.read(p) for p in paths]


def runs_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The runs table: one row per run's record (none configured: the columns alone)."""
    rows = [summarize(m) for m in records]
    frame = pd.DataFrame(rows, columns=None if rows else SUMMARY_COLUMNS)
    leading = [c for c in SUMMARY_COLUMNS if c in frame.columns]
    rest = [c for c in frame.columns if c not in leading]
    return frame[leading + rest].sort_values(["study", "run"], kind="stable")


def seed_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per seed of a run that trained (none for a skipped or failed run)."""
    if metrics["status"] not in record.RAN:
        return []
    return [
        {"study": metrics["study"], "run": metrics["run"], "seed": seed["seed"]}
        | {k: seed[k] for k in ("status", "reason", "kept")}
        | {m: record.seed_value(seed, m) for m in record.SEED_METRICS}
        for seed in metrics["seeds"]
    ]


def seeds_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The per-seed table: one row per seed of every run that trained."""
    rows = [row for m in records for row in seed_rows(m)]
    return pd.DataFrame(rows, columns=["study", "run", "seed", *SEED_COLUMNS])


def main_from_snakemake(snakemake: Any, log: IO[str]) -> None:
    """Entry of the `aggregate_runs` rule (workflow/scripts/aggregate_runs.py); `log` is the
    rule's log, open (dmls.joblog)."""
    records = read_all([Path(p) for p in snakemake.input.metrics])  # each file read once
    frame = runs_table(records)
    atomic_write(Path(snakemake.output.table), lambda f: frame.to_csv(f, index=False))
    seeds = seeds_table(records)
    atomic_write(Path(snakemake.output.seeds), lambda f: seeds.to_csv(f, index=False))
    print(
        f"{len(frame)} runs: {frame['status'].value_counts().to_dict()}; {len(seeds)} seeds",
        file=log,
    )
