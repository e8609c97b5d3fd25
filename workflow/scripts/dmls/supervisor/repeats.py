"""A run's seeds combined: what metrics.json says of the run as a whole.

The job returns every seed's result (training/results.py `seed_result`); this adds
- `summary`: per metric, the mean over the seeds with its 95% Student-t interval (dmls/stats.py;
  one seed: the value, no interval);
- `final`: the means of the seeds' final numbers, and each seed's early-stopping and divergence
  epoch;
- `history`: per epoch, the mean over the seeds that trained it (`seeds` says how many) and the
  interval's half-width of the losses and accuracies.
"""

from __future__ import annotations

from typing import Any

from dmls.stats import mean_interval

# What `summary` holds: (where in a seed's result, metric).
FINAL_METRICS = (
    "train_loss", "train_accuracy", "test_loss", "test_accuracy", "best_test_accuracy",
    "epochs_completed",
)  # fmt: skip
TIMING_METRICS = ("train_time_s", "first_epoch_s", "steady_epoch_s", "samples_per_s")
MEMORY_METRICS = ("peak_gpu_mem_allocated_bytes", "peak_gpu_mem_reserved_bytes")
# The GPUs' joules (training/energy.py), where measured.
ENERGY_METRICS = ("train_energy_j", "eval_energy_j", "steady_epoch_energy_j")
SUMMARY_METRICS = (*FINAL_METRICS, *TIMING_METRICS, *MEMORY_METRICS, *ENERGY_METRICS)
# Per-epoch columns of a seed's history that are averaged, and those drawn with their spread.
HISTORY_METRICS = (
    "train_loss", "train_accuracy", "test_loss", "test_accuracy", "train_time_s", "eval_time_s",
    "lr", "train_energy_j", "eval_energy_j",
)  # fmt: skip
HISTORY_SPREAD = ("train_loss", "train_accuracy", "test_loss", "test_accuracy")


def seed_value(seed: dict[str, Any], metric: str) -> float | None:
    """One seed's value of a `SUMMARY_METRICS` metric."""
    if metric in FINAL_METRICS:
        return seed["final"][metric]
    if metric in TIMING_METRICS:
        return seed["timing"][metric]
    if metric in ENERGY_METRICS:
        return (seed.get("energy") or {}).get(metric)  # (no key: a seed kept from before)
    return seed[metric]


def summary(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: mean, n, std and the 95% interval over the seeds (None where no seed has a
    finite value: e.g. GPU memory on a CPU; for the energy, where any seed has none)."""
    out: dict[str, Any] = {"seeds": len(seeds), "confidence": 0.95}
    for metric in SUMMARY_METRICS:
        values = [seed_value(s, metric) for s in seeds]
        if metric in ENERGY_METRICS and None in values:
            # A mean over the seeds whose epochs the counter resolved would favour the slow ones.
            values = []
        estimate = mean_interval(values)
        out[metric] = None if estimate is None else estimate.to_dict()
    return out


def mean_history(seeds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per epoch, the mean over the seeds that reached it (early stopping ends seeds at different
    epochs) and the 95% half-width of the losses and accuracies (None with one seed)."""
    by_epoch: dict[int, list[dict[str, Any]]] = {}
    for seed in seeds:
        for row in seed["history"]:
            by_epoch.setdefault(row["epoch"], []).append(row)
    history = []
    for epoch, rows in sorted(by_epoch.items()):
        entry: dict[str, Any] = {"epoch": epoch, "seeds": len(rows)}
        for metric in HISTORY_METRICS:
            estimate = mean_interval([r.get(metric) for r in rows])  # (energy: not everywhere)
            entry[metric] = None if estimate is None else estimate.mean
            if metric in HISTORY_SPREAD:
                entry[f"{metric}_ci95"] = None if estimate is None else estimate.half_width
        history.append(entry)
    return history


def combine(result: dict[str, Any]) -> dict[str, Any]:
    """The job's result with its seeds' `summary`, mean `final` and mean `history`."""
    seeds = result["seeds"]
    stats = summary(seeds)
    final = {m: (stats[m] or {}).get("mean") for m in FINAL_METRICS}
    final |= {
        "stopped_early_epochs": [s["final"]["stopped_early_epoch"] for s in seeds],
        "diverged_epochs": [s["final"]["diverged_epoch"] for s in seeds],
    }
    return result | {"summary": stats, "final": final, "history": mean_history(seeds)}
