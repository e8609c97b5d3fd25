"""Sentences computed from a study's numbers: every figure in them comes from the run files."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from dmls.report.cells import MIB, seconds
from dmls.report.study import OK, Study

# Test loss counts as having risen when it ends this much above its minimum (relative), so
# that epoch-to-epoch noise of a few parts per thousand is not called overfitting.
RISE_TOLERANCE = 0.01


def status_summary(study: Study) -> list[str]:
    """How the runs ended, with the reason of every run that has no numbers."""
    runs = study.runs
    line = f"{(runs['status'] == OK).sum()} of {len(runs)} runs finished"
    others = runs[runs["status"] != OK]
    if others.empty:
        return [line + "."]
    listed = ", ".join(f"{run} ({row['status']})" for run, row in others.iterrows())
    return [f"{line}; no numbers for {listed}: the reasons are in the results table."]


def versus_baseline(study: Study) -> list[str]:
    """Throughput, accuracy and memory of every finished run against the study's baseline."""
    base_name = study.baseline
    base = study.runs.loc[base_name]
    if base["status"] != OK:
        return [
            f"The baseline {base_name} has no numbers ({base['status']}), so no run is "
            "compared with it."
        ]
    lines = []
    for run, row in study.ok.iterrows():
        if run == base_name:
            continue
        parts = [
            f"{_ratio(row['samples_per_s'], base['samples_per_s'])} the training throughput "
            f"of {base_name} ({_s(row['train_time_s'])} vs {_s(base['train_time_s'])} "
            f"for {_epochs(row)})",
            f"test accuracy {_points(row['test_accuracy'] - base['test_accuracy'])} "
            f"({100 * row['test_accuracy']:.2f}% vs {100 * base['test_accuracy']:.2f}%)",
        ]
        memory = study.memory
        if memory:
            column, what = memory
            parts.append(
                f"{what} {row[column] / MIB:.1f} vs {base[column] / MIB:.1f} MiB "
                f"({_ratio(row[column], base[column])})"
            )
        lines.append(f"{run}: " + ", ".join(parts) + ".")
    return lines


def scaling(study: Study) -> list[str]:
    """Speed-up over the baseline against the ideal (linear in workers) and its efficiency."""
    base = study.runs.loc[study.baseline]
    if base["status"] != OK or not study.scales_workers:
        return []
    lines = []
    for run, row in study.ok.iterrows():
        reference = study.scaling_reference(run)
        if reference in (None, run):
            continue
        ref = study.runs.loc[reference]
        speedup = row["samples_per_s"] / ref["samples_per_s"]
        ideal = row["replicas"] / ref["replicas"]
        lines.append(
            f"{run} ({_workers(row['replicas'])}): speed-up {speedup:.2f}× over "
            f"{reference} ({_workers(ref['replicas'])}); "
            f"ideal {ideal:.0f}×, parallel efficiency {100 * speedup / ideal:.0f}%."
        )
    cores = {m["host"]["cpu_count"] for m in study.metrics.values() if m["status"] == OK}
    if study.ok["nodes_emulated"].any():
        lines.append(
            "Nodes were emulated on one host: all processes share its "
            f"{'/'.join(map(str, sorted(cores)))} cores and talk over loopback, so these "
            "numbers measure the launcher and the collectives' overhead, not a network."
        )
    return lines


def sweep(study: Study) -> list[str]:
    """Trends along the one swept setting (batch size, accumulation steps)."""
    key = study.sweep_key
    ok = study.ok
    if key is None or len(ok) < 2:
        return []
    ok = ok.sort_values(f"spec.{key}")
    x = ok[f"spec.{key}"].to_numpy(dtype=float)
    lines = []
    memory = study.memory
    if memory and len(ok) >= 3:
        column, what = memory
        y = ok[column].to_numpy(dtype=float) / MIB
        slope, intercept = np.polyfit(x, y, 1)
        residual = np.sum((y - (slope * x + intercept)) ** 2)
        r2 = 1 - residual / max(np.sum((y - y.mean()) ** 2), 1e-12)
        lines.append(
            f"{what} vs {key}: {slope:.2f} MiB per unit of {key} plus {intercept:.1f} MiB "
            f"(least-squares line, R² = {r2:.3f})."
        )
    first, last = ok.iloc[0], ok.iloc[-1]
    lines.append(
        f"From {key} {_fmt(x[0])} to {_fmt(x[-1])}: training time {_s(first['train_time_s'])} → "
        f"{_s(last['train_time_s'])}, test accuracy {100 * first['test_accuracy']:.2f}% → "
        f"{100 * last['test_accuracy']:.2f}% ({_trend(ok['test_accuracy'])})."
    )
    return lines


def compared_with(study: Study, other: Study) -> list[str]:
    """Runs of the same name in another study (B2 accelerate beside B1 torchrun)."""
    lines = []
    for run, row in study.ok.iterrows():
        if run not in other.runs.index:
            continue
        theirs = other.runs.loc[run]
        if theirs["status"] != OK:
            lines.append(f"{run}: no {other.key} numbers to compare ({theirs['status']}).")
            continue
        lines.append(
            f"{run}: {_s(row['train_time_s'])} here vs {_s(theirs['train_time_s'])} in "
            f"{other.key} ({_ratio(theirs['train_time_s'], row['train_time_s'])} the speed), "
            f"test accuracy {_points(row['test_accuracy'] - theirs['test_accuracy'])}."
        )
    return lines


def precision_check(study: Study) -> list[str]:
    """Runs whose measured compute precision is not the one they asked for."""
    lines = []
    for run, row in study.ok.iterrows():
        asked = row["spec.precision"]
        measured = row["effective_precision"]
        # Ranks join what they measured with "/", layer kinds within a rank with "+".
        if asked != "fp32" and asked not in re.split(r"[/+]", str(measured)):
            lines.append(
                f"{run}: asked for {asked}, but the layers computed in {measured} "
                "(see the precision probe in dmls/training/precision.py)."
            )
    return lines


def step_check(study: Study) -> list[str]:
    """GPU runs that asked for a CUDA-graph step but trained eagerly, one line per reason (on a
    CPU the reason goes without saying; runs.csv still records it)."""
    ok = study.ok
    if ok.empty:
        return []
    gpu = ok["device"].astype(str).str.startswith("cuda")
    eager = ok[gpu & (ok["spec.step"] != "eager") & (ok["step_mode"] == "eager")]
    return [
        f"Trained eagerly, not from a CUDA graph ({reason}): {', '.join(group.index)}."
        for reason, group in eager.groupby("step_eager_reason", sort=False)
    ]


def timing_caveat(study: Study) -> list[str]:
    isolation = study.isolation
    if "none" in isolation:
        return [
            "These runs shared the host with other jobs (isolation: none), so their timings "
            "are not comparable with each other."
        ]
    if "devices" in isolation:
        return [
            "These runs had other jobs beside them on other cores and GPUs (isolation: "
            "devices): no core or GPU was shared, but the CPU package was (boost clock, memory "
            "bandwidth), so host-bound steps may be slower than on a host of their own."
        ]
    return []


def generalization(study: Study) -> dict[str, Any] | None:
    """Overfitting signs per run (A2): final gaps, epoch of minimum test loss, and a flag where
    test loss rose after its minimum while train loss kept falling."""
    rows = []
    flagged = []
    for run, history in study.histories.items():
        if len(history) < 2:
            continue
        last = history.iloc[-1]
        best = history.loc[history["test_loss"].idxmin()]
        rose = last["test_loss"] > best["test_loss"] * (1 + RISE_TOLERANCE)
        fell = last["train_loss"] < best["train_loss"]
        overfits = bool(rose and fell)
        if overfits:
            flagged.append(run)
        rows.append(
            [
                run,
                _points(last["train_accuracy"] - last["test_accuracy"], sign=False),
                f"{last['test_loss'] - last['train_loss']:.4f}",
                f"{int(best['epoch'])} of {int(last['epoch'])}",
                f"{best['test_loss']:.4f} → {last['test_loss']:.4f}",
                "yes" if overfits else "no",
            ]
        )
    if not rows:
        return None
    if flagged:
        summary = (
            f"Test loss rose after its minimum while train loss kept falling in: "
            f"{', '.join(flagged)} — the signature of overfitting."
        )
    else:
        summary = (
            "No run shows test loss rising (by more than "
            f"{100 * RISE_TOLERANCE:.0f}%) after its minimum while train loss fell."
        )
    return {
        "columns": [
            "run",
            "Final gap, train − test acc. (points)",
            "Final gap, test − train loss",
            "Epoch of min. test loss",
            "Test loss: min → final",
            "Overfitting flag",
        ],
        "rows": rows,
        "summary": summary,
    }


def all_observations(study: Study, other: Study | None = None) -> list[str]:
    lines = versus_baseline(study) + scaling(study) + sweep(study) + precision_check(study)
    lines += step_check(study)
    if other is not None:
        lines += compared_with(study, other)
    return lines + timing_caveat(study)


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}×"


def _points(delta: float, sign: bool = True) -> str:
    text = f"{100 * delta:+.1f}" if sign else f"{100 * delta:.1f}"
    return text.replace("-", "−") + (" points" if sign else "")


def _epochs(row: pd.Series) -> str:
    n = int(row["epochs_completed"])
    return f"{n} epoch{'s' if n != 1 else ''}"


def _s(value: float) -> str:
    return f"{seconds(value)} s"


def _workers(n: int) -> str:
    return f"{int(n)} worker{'s' if n != 1 else ''}"


def _fmt(value: float) -> str:
    return f"{value:g}"


def _trend(values: pd.Series) -> str:
    diffs = np.diff(values.to_numpy(dtype=float))
    if (diffs <= 0).all():
        return "falling at every step"
    if (diffs >= 0).all():
        return "rising at every step"
    return "not monotonic"
