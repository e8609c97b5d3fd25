"""How the report writes a value into a table cell, for every table it shows: the study tables,
the all-runs table and the special studies' tables (and runs.csv's list settings).

A missing value (None or NaN), or a number of a row that has none to show (a run or a part
that did not finish), is an empty cell; a number of a known column has that column's format
(`FORMATS`), any other number the general one (`number`). A mean over seeds is shown with the
half-width of its 95% interval, "79.60 ± 0.52", in the same format; one seed, the value alone.
An interval that would leave what its quantity can be (`bounds_of`: below 0, an accuracy
above 100%) is shown as its range cut there, "36.33 (0.00–100.00, cut)", never as mean ±
half-width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

MIB = 2**20


def missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def cell(
    value: Any,
    fmt: Callable[[Any], str],
    *,
    shown: bool = True,
    ci95: float | None = None,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> str:
    """`value` in format `fmt`, with ` ± ci95` where the half-width of its interval is given;
    empty where the value is missing or not `shown`. Where the interval leaves `bounds` (what
    the quantity can be), its range cut at them: "7,423 (0–20,707, cut)"."""
    if not shown or missing(value):
        return ""
    if missing(ci95):
        return fmt(value)
    low, high = value - ci95, value + ci95
    if low >= bounds[0] and high <= bounds[1]:
        return f"{fmt(value)} ± {fmt(ci95)}"
    return f"{fmt(value)} ({fmt(max(low, bounds[0]))}–{fmt(min(high, bounds[1]))}, cut)"


def bounds_of(column: str) -> tuple[float, float]:
    """What a column's quantity can be: an accuracy (train, validation, test; a proportion) 0
    to 1, any other number of a run's summary row or history (times, speeds, bytes, losses,
    energy, counts) 0 and up."""
    return (0.0, 1.0) if column.endswith("accuracy") else (0.0, math.inf)


def fixed(spec: str) -> Callable[[Any], str]:
    """A format spec, e.g. fixed(".4f")."""
    return lambda value: format(value, spec)


def percent(value: float) -> str:
    """A fraction as percent, two decimals (accuracies)."""
    return f"{100 * value:.2f}"


def seconds(value: float) -> str:
    """A duration's number: one decimal from 10 s up, two below (tiny test runs)."""
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def epoch_seconds(value: float) -> str:
    """An epoch's or a run's duration in a table: as `seconds` from 1 s up, three significant
    digits below (a GPU epoch of 0.048 s ± 0.0015 read "0.05 ± 0.00"), never in exponent form
    (an interval of 4e-05 s is 0.00004)."""
    if abs(value) >= 1:
        return seconds(value)
    return np.format_float_positional(value, precision=3, unique=False, fractional=False, trim="-")


def mib(value: float) -> str:
    """Bytes as MiB, one decimal."""
    return f"{value / MIB:.1f}"


def joules(value: float) -> str:
    """Energy: whole joules from 100 J up, three significant digits below."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def number(value: Any) -> str:
    """Any value of a table without column formats (the special studies' CSVs): integers with
    thousands separators, other floats to 4 significant digits, booleans as yes/no."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() and abs(value) >= 1 else f"{value:.4g}"
    return str(value)


def setting(value: Any) -> str:
    """A run setting in the settings table and Snakemake's labels: a dash where unset."""
    return "—" if missing(value) else str(value)


def joined(value: Any) -> Any:
    """A list setting as one cell ('8,16'); any other value as it is."""
    return ",".join(map(str, value)) if isinstance(value, list | tuple) else value


# How each number of a run's summary row (dmls.report.aggregate.summarize) is shown, in every
# table of the report; only `ok` runs show numbers.
FORMATS: dict[str, Callable[[Any], str]] = {
    "device": str,
    "effective_precision": str,
    "processes": str,
    "global_batch_size": str,
    "n_seeds": fixed(".0f"),
    "epochs_completed": fixed(".0f"),
    "train_accuracy": percent,
    "test_accuracy": percent,
    "train_loss": fixed(".4f"),
    "test_loss": fixed(".4f"),
    "train_time_s": epoch_seconds,
    "first_epoch_s": epoch_seconds,
    "steady_epoch_s": epoch_seconds,
    "samples_per_s": fixed(",.0f"),
    "gpu_mem_per_gpu": str,
    "peak_host_rss_bytes": mib,
    "peak_gpu_mem_allocated_bytes": mib,
    "step_gpu_mem_bytes": mib,
    "graph_pool_reserved_bytes": mib,
    "time_to_target_s": epoch_seconds,
    "epochs_to_target": fixed(".1f"),
    "seeds_to_target": str,
    "train_energy_j": joules,
    "steady_epoch_energy_j": joules,
    "energy_to_target_j": joules,
}


# How a data set is named where a section says what it ran on.
DATA_NAMES = {
    "cifar10": "CIFAR-10",
    "fashion_mnist": "Fashion-MNIST",
    "synthetic_cifar": "CIFAR-shaped images",  # (SYNTHETIC is said beside it)
    "tabular": "the tabular set",
}


def gpu_card(host: dict[str, Any]) -> str | None:
    """A host's GPUs as one card count, "4× NVIDIA H200"; None on a host without a GPU."""
    gpus = host.get("gpus") or []
    return f"{len(gpus)}× {gpus[0]}" if gpus else None


def data_name(dataset: str) -> str:
    """A data set as a sentence names it, SYNTHETIC said where it is: "Fashion-MNIST",
    "SYNTHETIC CIFAR-shaped images"."""
    synthetic = "SYNTHETIC " if dataset.startswith("synthetic") else ""
    return synthetic + DATA_NAMES.get(dataset, dataset)


def stand_in(dataset: str, course_data: str | None) -> str:
    """ " (real; a stand-in for the course's CIFAR-10)" where a section's data is not the one
    the course used (`course_data`, report/studies.yaml), else ""."""
    if not course_data or DATA_NAMES.get(dataset, dataset) == course_data:
        return ""
    real = "" if dataset.startswith("synthetic") else "real; "
    return f" ({real}a stand-in for the course's {course_data})"
