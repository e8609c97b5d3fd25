"""B4: where the B model spends time and memory, per module, measured with torch.profiler.

Each leaf module's forward runs inside a `record_function` range named after the module
(forward pre/post hooks), so the profiler attributes time and memory to the Linear, BatchNorm
and activation modules themselves, not by guessing from op names. One measurement profiles
`batches` test batches (inference: eval mode, no autograd); it is repeated `repeats` times per
activation and device, and the tables give mean and standard deviation over the repeats.
Memory is what the profiler saw allocated inside a module's range (its output, mostly), summed
over the batches; time totals include the ops inside the range.
"""

from __future__ import annotations

import logging
import statistics
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

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
MEASUREMENT_COLUMNS = ("device", "activation", "repeat", "label", "kind", "calls", *METRICS)
TABLE_COLUMNS = (
    "device", "activation", "kind", "modules", "calls", "repeats",
    *(f"{m}_{s}" for m in METRICS for s in ("mean", "std")),
)  # fmt: skip


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
        handles += [module.register_forward_pre_hook(enter(label)),
                    module.register_forward_hook(leave)]  # fmt: skip
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


def _aggregate(measurements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device, activation and kind: modules of a kind summed per repeat, then mean and
    standard deviation over repeats."""
    per_repeat: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    modules: dict[tuple, set[str]] = defaultdict(set)
    for m in measurements:
        key = (m["device"], m["activation"], m["kind"])
        modules[key].add(m["label"])
        for metric in ("calls", *METRICS):
            per_repeat[(*key, m["repeat"])][metric] += m[metric]
    table = []
    for key in modules:
        repeats = [v for k, v in per_repeat.items() if k[:3] == key]
        row: dict[str, Any] = {
            "device": key[0],
            "activation": key[1],
            "kind": key[2],
            "modules": len(modules[key]),
            "calls": int(repeats[0]["calls"]),
            "repeats": len(repeats),
        }
        for metric in METRICS:
            values = [r[metric] for r in repeats]
            row[f"{metric}_mean"] = statistics.fmean(values)
            row[f"{metric}_std"] = statistics.stdev(values) if len(values) > 1 else None
        table.append(row)
    return table


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
            {"device": "cuda", "activation": a, "status": "skipped",
             "reason": "no CUDA device on this host: only the CPU was profiled"}
            for a in cfg["activations"]
        ]  # fmt: skip
    measurements: list[dict[str, Any]] = []
    for device in devices:
        batches, wrapped = _test_batches(dataset.x_test, cfg["batch_size"], cfg["batches"], device)
        for activation in cfg["activations"]:
            torch.manual_seed(cfg["seed"])
            model = ClusterMLP(
                dataset.x_test.shape[1],
                dataset.manifest["num_classes"],
                cfg["hidden"],
                batch_norm=True,
                activation=activation,
            ).to(device)
            trace = traces / f"{device.type}_{activation}.json.gz"
            for repeat in range(cfg["repeats"]):
                log.info("%s %s: repeat %d/%d", device.type, activation, repeat + 1,
                         cfg["repeats"])  # fmt: skip
                for m in profile_batches(
                    model, batches, cfg["warmup_batches"], trace if repeat == 0 else None
                ):
                    measurements.append(
                        {"device": device.type, "activation": activation, "repeat": repeat, **m}
                    )
            rows.append(
                {"device": device.type, "activation": activation, "status": "ok", "reason": None,
                 "trace": str(trace.relative_to(out_dir)), "test_batches_wrapped": wrapped}
            )  # fmt: skip
    table = _aggregate(measurements)
    write_csv(out_dir / "measurements.csv", measurements, MEASUREMENT_COLUMNS)
    write_csv(out_dir / "modules.csv", table, TABLE_COLUMNS)
    save_figure(_figure(table, cfg["activations"]), out_dir / "profile.png")
    for row in rows:
        row["by_kind"] = {
            t["kind"]: {k: t[k] for k in t if k.endswith(("_mean", "_std"))}
            for t in table
            if (t["device"], t["activation"]) == (row["device"], row["activation"])
        }
    return {
        "rows": rows,
        "data": {k: dataset.manifest[k] for k in ("name", "synthetic", "source", "n_test")},
        "threads": threads,
    }


def _figure(table: list[dict[str, Any]], activations: list[str]):
    """Time and memory per module kind, one bar per activation, error bars = std over repeats."""
    devices = sorted({t["device"] for t in table})
    fig = new_figure(5.5 * len(devices), 7)
    axes = fig.subplots(2, len(devices), squeeze=False)
    width = 0.8 / len(activations)
    for col, device in enumerate(devices):
        on_gpu = device == "cuda"
        panels = (
            ("device_time_total_us" if on_gpu else "cpu_time_total_us", 1e-3, "time (ms)"),
            ("device_memory_bytes" if on_gpu else "cpu_memory_bytes", 1 / 1024, "memory (KiB)"),
        )
        for row, (metric, scale, unit) in enumerate(panels):
            ax = axes[row][col]
            for i, activation in enumerate(activations):
                cells = {
                    t["kind"]: t
                    for t in table
                    if t["device"] == device and t["activation"] == activation
                }
                ax.bar(
                    [k + (i - (len(activations) - 1) / 2) * width for k in range(len(KINDS))],
                    [cells[k][f"{metric}_mean"] * scale for k in KINDS],
                    width,
                    yerr=[(cells[k][f"{metric}_std"] or 0) * scale for k in KINDS],
                    capsize=2,
                    label=activation,
                )
            ax.set_xticks(range(len(KINDS)), KINDS)
            where = "GPU kernels" if on_gpu else "CPU"
            ax.set_title(f"{device.upper()}: {unit.split()[0]} ({where}), sum over batches")
            ax.set_ylabel(unit)
            ax.legend(fontsize=8, title="activation")
    return fig
