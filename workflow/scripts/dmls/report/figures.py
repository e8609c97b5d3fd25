"""Figures of one study, drawn with matplotlib (Agg) from its runs; PNG files for the reports.

Only `ok` runs are drawn. Bars and cells of runs without numbers are left empty and labelled
with their status, so a figure never shows a number for a run that failed or was skipped.
Every number is a mean over the run's seeds, drawn with its 95% interval: error bars on bars
and points, a shaded band around per-epoch curves (none with one seed).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, cast

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, MaxNLocator

from dmls import record
from dmls.files import save_figure
from dmls.report.cells import MIB, bounds_of, missing
from dmls.report.overfitting import held_out_loss
from dmls.report.study import OK, Study
from dmls.stats import Comparison

DPI = 110
# Every figure of a study draws run i in colour i, so a run keeps its colour across figures.
COLORS: tuple = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]  # a ListedColormap


def _save(fig: plt.Figure, path: Path) -> Path:
    """Write the figure as a PNG file (atomically, dmls.files) and release it from pyplot."""
    save_figure(fig, path, dpi=DPI)
    plt.close(fig)
    return path


def _color(study: Study, run: str):
    return COLORS[list(study.runs.index).index(run) % len(COLORS)]


def _tick(study: Study, run: str) -> str:
    status = study.runs.at[run, "status"]
    return run if status == OK else f"{run}\n({status})"


def _ci95(study: Study, run: str, column: str, scale: float = 1.0) -> float:
    """The half-width of `run`'s 95% interval of `column` in the axis' unit; NaN (no whisker,
    not even a cap that would read as an interval of width 0) where there is none: one seed,
    or a number of the whole job (host RSS)."""
    half: Any = study.runs.at[run, f"{column}_ci95"] if f"{column}_ci95" in study.runs else None
    return np.nan if missing(half) else half / scale


def _whiskers(
    column: str, values: list[float], errors: list[float], scale: float = 1.0
) -> list[list[float]]:
    """The whiskers below and above each value, cut where `column`'s quantity ends (0, an
    accuracy's 100%): two seeds' t intervals can reach past them (cells.bounds_of)."""
    low, high = (b / scale for b in bounds_of(column))
    return [
        [min(e, v - low) if not np.isnan(e) else e for e, v in zip(errors, values, strict=True)],
        [min(e, high - v) if not np.isnan(e) else e for e, v in zip(errors, values, strict=True)],
    ]


def _curve(
    ax: plt.Axes, history, column: str, scale: float = 1.0, *, band: bool = True, **style
) -> None:
    """One per-epoch curve, the mean over seeds, in a `band` of its 95% interval (history's
    `<column>_ci95`; no band with one seed)."""
    epochs, mean = history["epoch"], scale * history[column]
    (line,) = ax.plot(epochs, mean, **style)
    half = history.get(f"{column}_ci95")
    if band and half is not None and half.notna().any():
        half = scale * half.astype(float)
        low, high = (scale * b for b in bounds_of(column))  # (cut where the quantity ends)
        ax.fill_between(
            epochs,
            np.maximum(mean - half, low),
            np.minimum(mean + half, high),
            color=line.get_color(),
            alpha=0.15,
            linewidth=0,
        )


def run_curves(study: Study, run: str, path: Path) -> Path:
    """Train vs test loss and accuracy per epoch of one run, or why it has none."""
    history = study.histories.get(run)
    if history is None:
        row = study.runs.loc[run]
        return notice(f"{study.key}/{run}: {row['status']}", str(row["reason"]), path)
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, layout="constrained", figsize=(8, 3.2))
    for column, style, label in (("train", "--", "train"), ("test", "-", "test")):
        curve: dict[str, Any] = {"linestyle": style, "marker": "o", "label": label}
        _curve(loss_ax, history, f"{column}_loss", **curve)
        _curve(acc_ax, history, f"{column}_accuracy", 100, **curve)
    loss_ax.set(xlabel="epoch", ylabel="loss", title="Loss")
    acc_ax.set(xlabel="epoch", ylabel="accuracy (%)", title="Accuracy")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
        ax.legend()
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"{study.key}/{run}", fontsize=10)
    return _save(fig, path)


def notice(title: str, text: str, path: Path) -> Path:
    """A figure-sized note where there is nothing to draw (skipped or failed runs)."""
    fig, ax = plt.subplots(layout="constrained", figsize=(8, 1.6))
    ax.axis("off")
    ax.text(0.0, 0.9, title, fontsize=11, weight="bold", va="top", transform=ax.transAxes)
    ax.text(0.0, 0.55, textwrap.fill(text, 110), fontsize=9, va="top", transform=ax.transAxes)
    return _save(fig, path)


def _time_memory_accuracy(study: Study) -> list[tuple[str, str, float]]:
    """The panels of the overview and sweep figures, drawn only for a study with finished runs:
    (column, axis label, divisor)."""
    column, description = cast("tuple[str, str]", study.memory)  # (finished runs: one)
    return [
        # Throughput of the steady epochs: a total time would hold the first seed's warm-up.
        ("samples_per_s", "samples/s (steady epochs)", 1.0),
        (column, f"{description} (MiB)", MIB),
        ("test_accuracy", "test accuracy (%)", 0.01),
    ]


def overview(study: Study, path: Path) -> Path:
    """Throughput, memory and test accuracy of every run, side by side."""
    return _bars(study, _time_memory_accuracy(study), path)


def energy(study: Study, path: Path) -> Path:
    """The GPUs' energy per steady epoch (`Study.energy_column`), their mean power in training
    and, with a target accuracy, the energy to reach it, every run side by side."""
    column, per = study.energy_column
    panels = [
        (column, textwrap.fill(f"GPU energy {per} (J)", 40), 1.0),
        ("train_power_w", "mean GPU power in training (W)", 1.0),
    ]
    if study.target_accuracy is not None:
        target = f"{100 * study.target_accuracy:g}%"
        panels.append(("energy_to_target_j", f"GPU energy to {target} test acc. (J)", 1.0))
    return _bars(study, panels, path)


def _bars(study: Study, panels: list[tuple[str, str, float]], path: Path) -> Path:
    """One horizontal bar per run in each panel (column, axis label, divisor), with the 95%
    interval where the column has one; runs without numbers are labelled with their status."""
    runs = list(study.runs.index)
    ok = study.runs["status"] == OK
    fig, axes = plt.subplots(
        1, len(panels), layout="constrained", figsize=(4 * len(panels), 0.9 + 0.38 * len(runs))
    )
    y = np.arange(len(runs))
    for ax, (column, label, scale) in zip(axes, panels, strict=True):
        values = [study.runs.at[r, column] / scale if ok[r] else np.nan for r in runs]
        values = [np.nan if missing(v) else v for v in values]
        errors = [_ci95(study, r, column, scale) for r in runs]  # none without numbers
        whiskers = _whiskers(column, values, errors, scale)
        ax.barh(y, values, xerr=whiskers, capsize=3, color=[_color(study, r) for r in runs])
        for yi, value, error in zip(y, values, errors, strict=True):
            if not np.isnan(value):
                # Three significant digits, whole numbers from 1,000 up (not 1.57e+03).
                text = f" {value:,.0f}" if value >= 1000 else f" {value:.3g}"
                ax.text(value + np.nan_to_num(error), yi, text, va="center", fontsize=8)
        ax.set_yticks(y, [_tick(study, r) for r in runs] if ax is axes[0] else [])
        if wide(values):
            # A1's graph-replayed runs step 30× faster than the course's DataLoader code: on a
            # linear axis the runs its answer reads would be slivers.
            ax.set_xscale("log")
            label += "\nlog scale: the runs differ more than tenfold"
        else:
            # Few ticks, thousands as "k": five-digit throughputs ran into each other.
            ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.xaxis.set_major_formatter(FuncFormatter(_thousands))
        ax.invert_yaxis()
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
        ax.margins(x=0.18)
    fig.suptitle(study.title, fontsize=10)
    return _save(fig, path)


# Where a panel's largest value is more than this times its smallest, its axis is logarithmic.
WIDE = 10.0


def wide(values: list[float]) -> bool:
    """Whether a panel's finite, positive values span more than `WIDE` times."""
    positive = [v for v in values if not np.isnan(v) and v > 0]
    return len(positive) > 1 and max(positive) > WIDE * min(positive)


def _thousands(value: float, _position: int) -> str:
    """An axis tick: '50k' from 1,000 up, else as it is."""
    return f"{value / 1000:g}k" if abs(value) >= 1000 else f"{value:g}"


def overlay(study: Study, path: Path) -> Path:
    """Every finished run's loss and accuracy curves on shared axes (train dashed, test solid);
    only the test curves have bands, as several runs' bands of both would hide the lines."""
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, layout="constrained", figsize=(11, 3.8))
    for run, history in study.histories.items():
        train = {"linestyle": "--", "color": _color(study, run), "alpha": 0.7, "band": False}
        test = {"linestyle": "-", "color": _color(study, run), "label": run}
        _curve(loss_ax, history, "train_loss", **train)
        _curve(loss_ax, history, "test_loss", **test)
        _curve(acc_ax, history, "train_accuracy", 100, **train)
        _curve(acc_ax, history, "test_accuracy", 100, **test)
    loss_ax.set(xlabel="epoch", ylabel="loss", title="Loss (train dashed, test solid)")
    acc_ax.set(xlabel="epoch", ylabel="accuracy (%)", title="Accuracy (train dashed, test solid)")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    acc_ax.legend(fontsize=8, loc="best")
    return _save(fig, path)


def accuracy_over_time(study: Study, path: Path) -> Path:
    """Test accuracy against the training and evaluation time so far, the study's target
    accuracy as a line: how soon each run gets there. Means over the seeds the times to the
    target come from (record.timed_seeds: those of a warm process), per epoch."""
    fig, ax = plt.subplots(layout="constrained", figsize=(6.5, 3.6))
    for run in study.histories:
        history = pd.DataFrame(record.timed_history(study.metrics[run]))
        elapsed = (history["train_time_s"] + history["eval_time_s"]).cumsum()
        ax.plot(
            elapsed,
            100 * history["test_accuracy"],
            marker="o",
            markersize=3,
            color=_color(study, run),
            label=run,
        )
    assert study.target_accuracy is not None  # drawn only for a study with a target
    target = 100 * study.target_accuracy
    ax.axhline(target, color="grey", linestyle=":", label=f"target {target:g}%")
    ax.set(
        xlabel="training + evaluation time (s)",
        ylabel="test accuracy (%)",
        title="Test accuracy against time",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _save(fig, path)


def speedup(study: Study, path: Path) -> Path:
    """Speed-up in training throughput over each run's scaling reference (the baseline, or the
    fewest-worker run of its data path), against the ideal linear line; the error bars are the
    ratio's 95% interval over the seeds (Study.speedup)."""
    base = study.runs.loc[study.baseline]
    fig, ax = plt.subplots(layout="constrained", figsize=(5.5, 3.4))
    ok = study.ok
    references = [study.scaling_reference(run) for run in ok.index]
    workers = ok["replicas"].to_numpy(dtype=float)
    line = np.array(sorted({base["replicas"], *workers}), dtype=float)
    ax.plot(line, line / base["replicas"], ":", color="grey", label="ideal (linear)")
    for run, w in zip(ok.index, workers, strict=True):
        speedup = study.speedup(run)
        s, low, high = (1.0, 1.0, 1.0) if speedup is None else _bounds(speedup[1])
        ax.errorbar(
            w,
            s,
            yerr=[[s - low], [high - s]],
            fmt="o",
            capsize=3,
            zorder=3,
            color=_color(study, run),
            label=f"{run}: {s:.2f}×",
        )
    ax.set(
        xlabel="workers (processes, or GPUs under DataParallel)",
        ylabel=f"speed-up over {study.baseline}"
        if set(references) == {study.baseline}
        else "speed-up over the same data path's\nrun of fewest workers",
        title="Speed-up vs ideal",
    )
    ax.set_xticks(line)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _bounds(comparison: Comparison) -> tuple[float, float, float]:
    """(value, low, high), the interval collapsed onto the value where there is none."""
    if not comparison.has_interval:
        return comparison.value, comparison.value, comparison.value
    assert comparison.low is not None and comparison.high is not None  # has_interval
    return comparison.value, comparison.low, comparison.high


def grid_heatmap(study: Study, path: Path) -> Path:
    """Throughput (steady epochs) and test accuracy on the nodes x processes-per-node grid."""
    runs = study.grid
    nodes = sorted(runs["spec.nodes"].unique())
    procs = sorted(runs["spec.nproc_per_node"].unique())
    fig, axes = plt.subplots(1, 2, layout="constrained", figsize=(9, 1.2 + 1.1 * len(nodes)))
    panels = (
        ("samples_per_s", "samples/s (steady epochs)", 1.0, "viridis"),
        ("test_accuracy", "test accuracy (%)", 0.01, "viridis"),
    )
    for ax, (column, label, scale, cmap) in zip(axes, panels, strict=True):
        grid = np.full((len(nodes), len(procs)), np.nan)
        notes = {}
        for run, row in runs.iterrows():
            cell = (nodes.index(row["spec.nodes"]), procs.index(row["spec.nproc_per_node"]))
            if row["status"] == OK:
                grid[cell] = row[column] / scale
                half = _ci95(study, run, column, scale)
                notes[cell] = f"{grid[cell]:,.1f}" + ("" if np.isnan(half) else f"\n± {half:,.1f}")
            else:
                notes[cell] = row["status"]
        image = ax.imshow(grid, cmap=cmap, aspect="auto")
        for (i, j), _ in np.ndenumerate(grid):
            text = notes.get((i, j), "not run")
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=10,
                color="black",
                bbox={"facecolor": "white", "alpha": 0.7, "edgecolor": "none"},
            )
        ax.set_xticks(range(len(procs)), [str(p) for p in procs])
        ax.set_yticks(range(len(nodes)), [str(n) for n in nodes])
        ax.set(xlabel="processes per node", ylabel="nodes", title=label)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(study.title, fontsize=10)
    return _save(fig, path)


def sweep(study: Study, path: Path) -> Path:
    """Time, memory and test accuracy along the swept setting (batch size, accumulation)."""
    key = study.sweep_key
    ok = study.ok.sort_values(f"spec.{key}")
    x = ok[f"spec.{key}"].to_numpy(dtype=float)
    panels = _time_memory_accuracy(study)
    fig, axes = plt.subplots(1, 3, layout="constrained", figsize=(12, 3.4))
    for ax, (column, label, scale) in zip(axes, panels, strict=True):
        errors = [_ci95(study, run, column, scale) for run in ok.index]
        values = list(ok[column].to_numpy(dtype=float) / scale)
        whiskers = _whiskers(column, values, errors, scale)
        ax.errorbar(x, values, yerr=whiskers, marker="o", capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [f"{v:g}" for v in x])
        ax.set(xlabel=key, ylabel=label)
        ax.set_ylim(bottom=0)  # from zero: a flat line's noise must not draw a V
        ax.grid(alpha=0.3)
    fig.suptitle(study.title, fontsize=10)
    return _save(fig, path)


def generalization_gap(study: Study, path: Path) -> Path:
    """Train − test accuracy per epoch (A2): a gap that keeps widening means overfitting."""
    fig, (gap_ax, loss_ax) = plt.subplots(1, 2, layout="constrained", figsize=(11, 3.6))
    column, name = held_out_loss(study.histories)
    for run, history in study.histories.items():
        color = _color(study, run)
        gap = 100 * (history["train_accuracy"] - history["test_accuracy"])
        gap_ax.plot(history["epoch"], gap, marker="o", color=color, label=run)
        loss_ax.plot(
            history["epoch"],
            history["test_loss"] - history["train_loss"],
            marker="o",
            color=color,
            label=run,
        )
        best = history[column].idxmin()
        loss_ax.axvline(history.at[best, "epoch"], color=color, alpha=0.25)
    gap_ax.axhline(0, color="grey", lw=0.8)
    loss_ax.axhline(0, color="grey", lw=0.8)
    gap_ax.set(xlabel="epoch", ylabel="points", title="Train − test accuracy")
    loss_ax.set(
        xlabel="epoch",
        ylabel="loss difference",
        title=f"Test − train loss (vertical lines: epoch of min. {name})",
    )
    for ax in (gap_ax, loss_ax):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    gap_ax.legend(fontsize=8)
    return _save(fig, path)


def comparison(study: Study, other: Study, path: Path) -> Path:
    """Throughput (steady epochs) of the runs both studies share (B2 accelerate beside B1
    torchrun), with its 95% interval over seeds."""
    shared = [r for r in study.runs.index if r in other.runs.index]
    fig, ax = plt.subplots(layout="constrained", figsize=(7, 3.6))
    x = np.arange(len(shared))
    for offset, (s, color) in zip(
        (-0.2, 0.2), ((other, "tab:blue"), (study, "tab:orange")), strict=True
    ):
        values = [
            s.runs.at[r, "samples_per_s"] if s.runs.at[r, "status"] == OK else np.nan
            for r in shared
        ]
        errors = [_ci95(s, r, "samples_per_s") for r in shared]  # none for runs without numbers
        whiskers = _whiskers("samples_per_s", values, errors)
        ax.bar(x + offset, values, yerr=whiskers, capsize=3, width=0.4, color=color, label=s.key)
        for xi, value, r in zip(x, values, shared, strict=True):
            text = f"{value:,.0f}" if not np.isnan(value) else s.runs.at[r, "status"]
            ax.text(
                xi + offset,
                0 if np.isnan(value) else value,
                text,
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(x, shared)
    ax.set(ylabel="samples/s (steady epochs)", title=f"{study.key} vs {other.key}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def study_figures(study: Study, other: Study | None, folder: Path) -> list[tuple[str, Path]]:
    """Every figure that fits this study, as (name, path); the name keys the caption."""
    if study.ok.empty:
        reasons = "; ".join(f"{r}: {row['reason']}" for r, row in study.runs.iterrows())
        return [
            (
                "no_results",
                notice(f"{study.title}: no run finished", reasons, folder / "no_results.png"),
            )
        ]
    figures = [("overview", overview(study, folder / "overview.png"))]
    if study.histories:
        figures.append(("curves", overlay(study, folder / "curves.png")))
    if study.histories and study.target_accuracy is not None:
        figures.append(("time_to_accuracy", accuracy_over_time(study, folder / "time.png")))
    if study.energy_measured:
        figures.append(("energy", energy(study, folder / "energy.png")))
    if study.scales_workers and study.runs.at[study.baseline, "status"] == OK:
        figures.append(("speedup", speedup(study, folder / "speedup.png")))
    if study.is_grid:
        figures.append(("grid", grid_heatmap(study, folder / "grid.png")))
    if study.sweep_key and len(study.ok) >= 2:
        figures.append(("sweep", sweep(study, folder / "sweep.png")))
    if any(len(h) >= 2 for h in study.histories.values()):
        figures.append(("generalization", generalization_gap(study, folder / "generalization.png")))
    if other is not None:
        figures.append(("comparison", comparison(study, other, folder / "comparison.png")))
    return figures
