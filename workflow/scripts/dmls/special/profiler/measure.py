"""B4: where the B model spends time and memory, per module, measured with torch.profiler.

Each leaf module's forward runs inside a `record_function` range named after the module
(forward pre/post hooks), so the profiler attributes time and memory to the Linear, BatchNorm
and activation modules themselves, not by guessing from op names. One measurement profiles
`batches` test batches (inference: eval mode, no autograd); it is repeated `repeats` times per
activation and device, and the activations' models take turns: each repeat profiles every
model once, in an order drawn afresh per repeat (seeded), so that what drifts over the study (the
host's other work, its clock) falls on every activation alike and into the interval, not between
activations measured one block after another. repeats.csv keeps each repeat's sum per module
kind (ms, KiB) with its start (seconds from the study's) and its place in the repeat's order;
modules.csv gives the mean over the repeats and the half-width of its 95% Student-t interval.
Memory is what the profiler saw allocated inside a module's range (its output, mostly), summed
over the batches; time totals include the ops inside the range.

The summary's `verdicts` answer the course's questions per device: the module kind that costs
the most time and the most memory (in the ReLU model, and in each activation's), each as a
ratio to the second costliest, summed over the kind's modules as the course sums them and per
module (`per_layer`: the B model has more Linear modules than BatchNorm ones); the slowest
activation module as a ratio to the fastest and each activation's to ReLU; each activation
against the BatchNorm of its own pass (`vs_batchnorm`: a ratio per repeat, the same module
measured beside it); and the control: the identical BatchNorm in each activation's model
against ReLU's (`control`), which takes turns with nothing changed, so that it reads 1 within
its interval where the turns controlled the comparison. A ratio is that of the geometric
means over the repeats, with Welch's 95% interval on the logs (dmls.stats.ratio; per repeat:
dmls.stats.paired_ratio); kinds and activations are ranked by their arithmetic mean, the
number modules.csv shows.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from dmls import stats
from dmls.data import datasets
from dmls.files import new_figure, save_figure, write_csv
from dmls.training.models import ACTIVATIONS, ClusterMLP

log = logging.getLogger(__name__)

BATCH_LABEL = "batch"
MODULE_PREFIX = "module:"
KINDS = ("Linear", "BatchNorm", "Activation")
METRICS = (
    "cpu_time_total_us", "cpu_self_time_us", "cpu_memory_bytes",
    "device_time_total_us", "device_memory_bytes",
)  # fmt: skip
MEASUREMENT_COLUMNS = (
    "device", "activation", "repeat", "position", "started_s", "label", "kind", "calls", *METRICS
)  # fmt: skip
# measurements.csv keeps the profiler's µs and bytes; repeats.csv and modules.csv give the
# report's units, named in the columns: metric -> (column, factor).
UNITS = {
    "cpu_time_total_us": ("cpu_time_ms", 1e-3),
    "cpu_self_time_us": ("cpu_self_time_ms", 1e-3),
    "cpu_memory_bytes": ("cpu_memory_kib", 1 / 1024),
    "device_time_total_us": ("device_time_ms", 1e-3),
    "device_memory_bytes": ("device_memory_kib", 1 / 1024),
}
VALUES = tuple(name for name, _ in UNITS.values())
REPEAT_COLUMNS = (
    "device", "activation", "repeat", "position", "started_s", "kind", "modules", "calls",
    *VALUES,
)  # fmt: skip
TABLE_COLUMNS = (
    "device", "activation", "kind", "modules", "calls", "repeats",
    *(f"{v}_{s}" for v in VALUES for s in ("mean", "ci95")),
)  # fmt: skip
# The model the module kinds are compared in first: the course's (ReLU), when profiled.
REFERENCE_ACTIVATION = "relu"
RATIO_CONVENTION = (
    "value = geometric mean over the repeats of the first named / that of the second named "
    "(costliest / second, slowest / fastest, activation / relu, BatchNorm in an activation's "
    "model / in relu's); low, high: its 95% interval (Welch's t on the logs of the per-repeat "
    "values, dmls.stats.ratio); vs_batchnorm: the geometric mean over the repeats of the "
    "activation's time / the BatchNorm's in the same pass, Student's t on the logs "
    "(dmls.stats.paired_ratio); within_noise: the interval holds 1; means: arithmetic means "
    "over the repeats, in the metric's unit"
)


def module_kind(module: nn.Module) -> str | None:
    """The group a module is reported in; None for containers and anything else."""
    if isinstance(module, nn.Linear):
        return "Linear"
    if isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d):
        return "BatchNorm"
    if isinstance(module, tuple(ACTIVATIONS.values())):
        return "Activation"
    return None


@contextmanager
def labelled_modules(model: nn.Module) -> Iterator[dict[str, str]]:
    """Run every Linear/BatchNorm/activation module inside a record_function range named
    'module:<name>'; yield {label: kind}. Hooks are removed on exit."""
    labels: dict[str, str] = {}
    open_ranges: list[record_function] = []
    handles = []

    def enter(label: str):
        def hook(module, args):
            rf = record_function(label)
            rf.__enter__()
            open_ranges.append(rf)

        return hook

    def leave(module, args, output):
        open_ranges.pop().__exit__(None, None, None)

    for name, module in model.named_modules():
        kind = module_kind(module)
        if kind is None:
            continue
        label = f"{MODULE_PREFIX}{name} {type(module).__name__}"
        labels[label] = kind
        handles += [
            module.register_forward_pre_hook(enter(label)),
            module.register_forward_hook(leave),
        ]
    try:
        yield labels
    finally:
        for handle in handles:
            handle.remove()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_batches(
    model: nn.Module, batches: list[torch.Tensor], warmup: int, trace_path: Path | None = None
) -> list[dict[str, Any]]:
    """Profile the forward passes of `batches`; one row per labelled module and one for the
    whole batch ('batch'), with calls, times (µs, summed over calls) and memory (bytes)."""
    device = batches[0].device
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    model.eval()
    with labelled_modules(model) as labels, torch.no_grad():
        for i in range(warmup):
            model(batches[i % len(batches)])
        _synchronize(device)
        with profile(activities=activities, profile_memory=True, record_shapes=True) as prof:
            for x in batches:
                with record_function(BATCH_LABEL):
                    model(x)
            _synchronize(device)
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))  # .gz: torch compresses it
    kinds = labels | {BATCH_LABEL: "Model"}
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for event in prof.events():
        # Only the CPU-side ranges: on CUDA the same names also appear as GPU annotations,
        # and a range's device time already sums the kernels launched inside it.
        if event.name not in kinds or event.device_type != DeviceType.CPU:
            continue
        row = totals[event.name]
        row["calls"] += 1
        row["cpu_time_total_us"] += event.cpu_time_total
        row["cpu_self_time_us"] += event.self_cpu_time_total
        row["cpu_memory_bytes"] += event.cpu_memory_usage
        row["device_time_total_us"] += event.device_time_total
        row["device_memory_bytes"] += event.device_memory_usage
    missing = sorted(set(kinds) - set(totals))
    if missing:
        raise RuntimeError(f"the profiler recorded no range for {missing}")
    return [
        {
            "label": label,
            "kind": kinds[label],
            **totals[label],
            "calls": int(totals[label]["calls"]),
        }
        for label in kinds
    ]


def _test_batches(
    x_test, batch_size: int, batches: int, device: torch.device
) -> tuple[list[torch.Tensor], bool]:
    """`batches` consecutive test batches on `device`; wraps around a small test set."""
    n = len(x_test)
    wrapped = batches * batch_size > n
    idx = torch.arange(batches * batch_size) % n
    x = torch.from_numpy(x_test)[idx].to(device)
    return list(x.split(batch_size)), wrapped


def _per_repeat(measurements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device, activation, repeat and kind: the kind's modules summed, in ms and KiB, with
    the pass's place in its repeat's order and its start."""
    sums: dict[tuple, dict[str, Any]] = {}
    for m in measurements:
        key = (m["device"], m["activation"], m["repeat"], m["kind"])
        row = sums.setdefault(
            key,
            dict(zip(("device", "activation", "repeat", "kind"), key, strict=True))
            | {"position": m["position"], "started_s": m["started_s"], "modules": 0, "calls": 0}
            | dict.fromkeys(VALUES, 0.0),
        )
        row["modules"] += 1
        row["calls"] += int(m["calls"])
        for metric, (name, factor) in UNITS.items():
            row[name] += m[metric] * factor
    return list(sums.values())


def _aggregate(repeat_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device, activation and kind: the mean over the repeats and the half-width of its
    95% Student-t interval (None with one repeat)."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in repeat_rows:
        groups[(r["device"], r["activation"], r["kind"])].append(r)
    table = []
    for (device, activation, kind), rows in groups.items():
        row: dict[str, Any] = {
            "device": device,
            "activation": activation,
            "kind": kind,
            "modules": rows[0]["modules"],
            "calls": rows[0]["calls"],
            "repeats": len(rows),
        }
        for name in VALUES:
            estimate = stats.mean_interval([r[name] for r in rows])
            assert estimate is not None  # a group has a repeat, its sums finite
            row[f"{name}_mean"] = estimate.mean
            row[f"{name}_ci95"] = estimate.half_width
        table.append(row)
    return table


def _metrics(device: str) -> tuple[str, str]:
    """The time and memory a device's verdicts compare: on a GPU, what its kernels took."""
    if device == "cuda":
        return "device_time_ms", "device_memory_kib"
    return "cpu_time_ms", "cpu_memory_kib"


def _ratio(a: list[float], b: list[float], how=stats.ratio) -> dict[str, Any]:
    """`how` (stats.ratio, or stats.paired_ratio repeat by repeat) of `a` over `b` as stored."""
    result = how(a, b)
    if result is None:  # a side has no positive value (memory freed as much as it took)
        return {"value": None, "low": None, "high": None, "within_noise": None}
    return {
        "value": result.value,
        "low": result.low,
        "high": result.high,
        "within_noise": result.within_noise,
    }


def _values(repeat_rows, device: str, activation: str, kind: str, metric: str) -> list[float]:
    return [
        r[metric]
        for r in repeat_rows
        if (r["device"], r["activation"], r["kind"]) == (device, activation, kind)
    ]


def _costliest(
    repeat_rows, device: str, activation: str, metric: str, per_layer: bool = False
) -> dict[str, Any]:
    """The module kind with the largest mean `metric` (summed over the kind's modules, or per
    module) and its ratio to the second."""
    modules = {
        r["kind"]: r["modules"] if per_layer else 1
        for r in repeat_rows
        if (r["device"], r["activation"]) == (device, activation) and r["kind"] in KINDS
    }
    values = {
        k: [v / modules[k] for v in _values(repeat_rows, device, activation, k, metric)]
        for k in KINDS
    }
    means = {k: statistics.fmean(v) for k, v in values.items()}
    first, second = sorted(KINDS, key=lambda k: -means[k])[:2]  # ties: KINDS' order
    return {
        "metric": metric,
        "costliest": first,
        "second": second,
        **_ratio(values[first], values[second]),
        "n": len(values[first]),
        "means": means,
        "modules": modules if per_layer else None,
    }


def _activations(repeat_rows, device: str, activations: list[str], metric: str):
    """The slowest activation module against the fastest, and each one against ReLU."""
    values = {a: _values(repeat_rows, device, a, "Activation", metric) for a in activations}
    means = {a: statistics.fmean(v) for a, v in values.items()}
    ranked = sorted(activations, key=lambda a: -means[a])
    block = {
        "metric": metric,
        "kind": "Activation",
        "slowest": ranked[0],
        "fastest": ranked[-1],
        **_ratio(values[ranked[0]], values[ranked[-1]]),
        "n": len(values[ranked[0]]),
        "means": means,
    }
    if REFERENCE_ACTIVATION in values:
        relu = values[REFERENCE_ACTIVATION]
        block["vs_relu"] = {
            a: _ratio(values[a], relu) for a in activations if a != REFERENCE_ACTIVATION
        }
    norms = {a: _values(repeat_rows, device, a, "BatchNorm", metric) for a in activations}
    block["vs_batchnorm"] = {
        a: _ratio(values[a], norms[a], stats.paired_ratio) for a in activations
    }
    reference = REFERENCE_ACTIVATION if REFERENCE_ACTIVATION in norms else activations[0]
    block["control"] = {
        "kind": "BatchNorm",
        "reference": reference,
        **{a: _ratio(norms[a], norms[reference]) for a in activations if a != reference},
    }
    return block


def _drift(repeat_rows, device: str, metric: str) -> dict[str, Any] | None:
    """How the identical BatchNorm's time moved over the study: a line through each pass's
    (start, time), every activation's model, its slope times the study's span as a share of
    the mean (`over_study`, with its interval); None with fewer than three passes."""
    rows = [r for r in repeat_rows if r["device"] == device and r["kind"] == "BatchNorm"]
    starts = [r["started_s"] for r in rows]
    if len(rows) < 3 or len(set(starts)) < 2:
        return None
    span = max(starts) - min(starts)
    mean = statistics.fmean(r[metric] for r in rows)
    slope = stats.line(starts, [r[metric] / mean * span for r in rows]).slope
    return {
        "metric": metric,
        "over_study": slope.value,
        "low": slope.low,
        "high": slope.high,
        "passes": len(rows),
        "seconds": span,
    }


def verdicts(repeat_rows: list[dict[str, Any]], activations: list[str]) -> dict[str, Any]:
    """The summary's answers, per device profiled, from the per-repeat values."""
    reference = REFERENCE_ACTIVATION if REFERENCE_ACTIVATION in activations else activations[0]
    by_device = {}
    for device in dict.fromkeys(r["device"] for r in repeat_rows):
        time_metric, memory_metric = _metrics(device)
        by_activation = {
            a: {
                "time": _costliest(repeat_rows, device, a, time_metric),
                "memory": _costliest(repeat_rows, device, a, memory_metric),
                "time_per_layer": _costliest(repeat_rows, device, a, time_metric, True),
            }
            for a in activations
        }
        by_device[device] = {
            "activation": reference,
            **by_activation[reference],
            "activations": _activations(repeat_rows, device, activations, time_metric),
            "drift": _drift(repeat_rows, device, time_metric),
            "by_activation": by_activation,
        }
    repeats = {r["repeat"] for r in repeat_rows}
    return {"convention": RATIO_CONVENTION, "repeats": len(repeats), "by_device": by_device}


def _measure_device(
    device: torch.device,
    dataset: Any,
    batches: list[torch.Tensor],
    cfg: dict[str, Any],
    traces: Path,
    start: float,
) -> list[dict[str, Any]]:
    """Every activation's model profiled on `device`, the activations taking turns in an order
    drawn anew for each repeat (stats.turns), each measurement with its repeat, its place in
    the repeat's order and when the repeat began (seconds since `start`); the first repeat of
    each also writes its trace into `traces`."""
    models = {}
    for activation in cfg["activations"]:
        torch.manual_seed(cfg["seed"])
        models[activation] = ClusterMLP(
            dataset.x_test.shape[1],
            dataset.manifest["num_classes"],
            cfg["hidden"],
            batch_norm=True,
            activation=activation,
        ).to(device)
    measurements: list[dict[str, Any]] = []
    orders = stats.turns(cfg["activations"], cfg["repeats"], cfg["seed"])
    for repeat, order in enumerate(orders):
        for position, activation in enumerate(order):
            log.info("%s %s: repeat %d/%d", device.type, activation, repeat + 1, cfg["repeats"])
            trace = traces / f"{device.type}_{activation}.json.gz"
            begun = time.monotonic() - start
            first = trace if repeat == 0 else None
            for m in profile_batches(models[activation], batches, cfg["warmup_batches"], first):
                measurements.append(
                    {
                        "device": device.type,
                        "activation": activation,
                        "repeat": repeat,
                        "position": position,
                        "started_s": round(begun, 4),
                        **m,
                    }
                )
    return measurements


def run(
    cfg: dict[str, Any], out_dir: Path, *, data_dir: Path, threads: int, **_: Any
) -> dict[str, Any]:
    torch.set_num_threads(threads)
    dataset = datasets.load(data_dir, "tabular")
    traces = out_dir / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    devices = [torch.device("cpu")]
    rows: list[dict[str, Any]] = []
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    else:
        rows += [
            {
                "device": "cuda",
                "activation": a,
                "status": "skipped",
                "reason": "no CUDA device on this host: only the CPU was profiled",
            }
            for a in cfg["activations"]
        ]
    measurements: list[dict[str, Any]] = []
    start = time.monotonic()
    for device in devices:
        batches, wrapped = _test_batches(dataset.x_test, cfg["batch_size"], cfg["batches"], device)
        measurements += _measure_device(device, dataset, batches, cfg, traces, start)
        for activation in cfg["activations"]:
            trace = traces / f"{device.type}_{activation}.json.gz"
            rows.append(
                {
                    "device": device.type,
                    "activation": activation,
                    "status": "ok",
                    "reason": None,
                    "trace": str(trace.relative_to(out_dir)),
                    "test_batches_wrapped": wrapped,
                }
            )
    repeat_rows = _per_repeat(measurements)
    table = _aggregate(repeat_rows)
    write_csv(out_dir / "measurements.csv", measurements, MEASUREMENT_COLUMNS)
    write_csv(out_dir / "repeats.csv", repeat_rows, REPEAT_COLUMNS)
    write_csv(out_dir / "modules.csv", table, TABLE_COLUMNS)
    save_figure(_figure(table, cfg["activations"]), out_dir / "profile.png")
    for row in rows:
        row["by_kind"] = {
            t["kind"]: {k: t[k] for k in t if k.endswith(("_mean", "_ci95"))}
            for t in table
            if (t["device"], t["activation"]) == (row["device"], row["activation"])
        }
    return {
        "rows": rows,
        "data": {k: dataset.manifest[k] for k in ("name", "synthetic", "source", "n_test")},
        "threads": threads,
        "verdicts": verdicts(repeat_rows, cfg["activations"]),
    }


def _figure(table: list[dict[str, Any]], activations: list[str]):
    """Time and memory per module kind, one bar per activation, error bars = the half-width
    of the 95% interval of the mean over the repeats."""
    devices = sorted({t["device"] for t in table})
    fig = new_figure(5.5 * len(devices), 7)
    axes = fig.subplots(2, len(devices), squeeze=False)
    width = 0.8 / len(activations)
    for col, device in enumerate(devices):
        on_gpu = device == "cuda"
        panels = zip(_metrics(device), ("time (ms)", "memory (KiB)"), strict=True)
        for row, (metric, unit) in enumerate(panels):
            ax = axes[row][col]
            for i, activation in enumerate(activations):
                cells = {
                    t["kind"]: t
                    for t in table
                    if t["device"] == device and t["activation"] == activation
                }
                ax.bar(
                    [k + (i - (len(activations) - 1) / 2) * width for k in range(len(KINDS))],
                    [cells[k][f"{metric}_mean"] for k in KINDS],
                    width,
                    yerr=[cells[k][f"{metric}_ci95"] or 0 for k in KINDS],
                    capsize=2,
                    label=activation,
                )
            ax.set_xticks(range(len(KINDS)), KINDS)
            where = "GPU kernels" if on_gpu else "CPU"
            ax.set_title(f"{device.upper()}: {unit.split()[0]} ({where}), sum over batches")
            ax.set_ylabel(unit)
            ax.legend(fontsize=8, title="activation")
    return fig
