"""Study C: Conv2d + ReLU through cuDNN, through the fused kernel, without cuDNN, on the CPU.

The networks are the course CNN (models.CourseCNN) with `depth` 3×3 conv layers of `channels`
channels, each layer its own weights, and no batch norm, so every conv feeds its ReLU directly;
the fused variant swaps each Conv2d + ReLU for FusedConvReLU. Every variant of a depth starts
from the same weights and trains on the same batches for the same epochs (Adam). Forward
(model and loss) and backward times are summed over the training steps after `warmup_steps`,
with CUDA events on the GPU and perf_counter on the CPU; the optimizer step is in neither.

Every mode's training is repeated `repeats` times, each repeat from the same weights over the
same batches; the modes take turns within a repeat (the order rotates from one repeat to the
next), so drift of the clocks or the host hits every mode alike. repeats.csv keeps each
repeat's numbers; results.csv gives their mean and the half-width of its 95% Student-t
interval (`_ci95`). The summary's `verdicts` give, per depth, the fused kernel against cuDNN as
cudnn time / fused time (> 1: the fused kernel is faster), the ratio of the geometric means
over the repeats with Welch's 95% interval on the logs (dmls.stats.ratio), and each mode's
test accuracy in percent with its interval.
"""

from __future__ import annotations

import copy
import logging
import math
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dmls import stats
from dmls.data import datasets
from dmls.files import new_figure, save_figure, write_csv
from dmls.special.kernels.fused_conv_relu import fuse_conv_relu, load_extension
from dmls.training.models import CourseCNN

log = logging.getLogger(__name__)

EVAL_BATCH = 1000
# Means over the repeats; `_ci95`: the half-width of the mean's 95% interval (None with one).
COLUMNS = (
    "depth", "mode", "title", "status", "reason", "device", "device_name", "fused_layers",
    "epochs", "steps", "timed_steps", "repeats", "forward_time_s", "forward_time_s_ci95",
    "backward_time_s", "backward_time_s_ci95", "train_loss", "test_accuracy",
    "test_accuracy_ci95", "wall_time_s", "threads",
)  # fmt: skip
# One row per depth, mode and repeat; `order`: the mode's turn within the repeat (0 = first).
REPEAT_COLUMNS = (
    "depth", "mode", "repeat", "order", "device", "timed_steps", "forward_time_s",
    "backward_time_s", "train_loss", "test_accuracy", "wall_time_s",
)  # fmt: skip
WITH_INTERVAL = ("forward_time_s", "backward_time_s", "test_accuracy")
SPEEDUP_CONVENTION = (
    "value = geometric mean over the repeats of the cudnn mode's time / that of the fused "
    "mode, so > 1 means the fused kernel is faster; low, high: its 95% interval (Welch's t on "
    "the logs of the per-repeat times, dmls.stats.ratio); within_noise: the interval holds 1. "
    "test_accuracy_percent: mean over the repeats and its 95% Student-t interval, in percent"
)


@dataclass(frozen=True)
class Mode:
    device: str
    fused: bool
    cudnn: bool
    title: str


MODES = {
    "cudnn": Mode("cuda", fused=False, cudnn=True, title="baseline, cuDNN"),
    "fused": Mode("cuda", fused=True, cudnn=True, title="FusedConvReLU kernel"),
    "no_cudnn": Mode("cuda", fused=False, cudnn=False, title="baseline, cuDNN disabled"),
    "cpu": Mode("cpu", fused=False, cudnn=True, title="baseline, CPU"),
}


class StepTimer:
    """Sums the time of named spans over training steps; CUDA events on a GPU (read once at
    the end, so timing adds no host synchronisation), perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.events: dict[str, list[tuple[Any, Any]]] = {"forward": [], "backward": []}
        self.seconds = {"forward": 0.0, "backward": 0.0}

    @contextmanager
    def span(self, name: str, timed: bool) -> Iterator[None]:
        if not timed:
            yield
        elif self.cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            yield
            end.record()
            self.events[name].append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self.seconds[name] += time.perf_counter() - t0

    def totals(self) -> dict[str, float]:
        if not self.cuda:
            return dict(self.seconds)
        torch.cuda.synchronize()
        return {
            name: sum(s.elapsed_time(e) for s, e in pairs) / 1000
            for name, pairs in self.events.items()
        }


def build_cnn(depth: int, cfg: dict[str, Any], input_shape, num_classes: int) -> nn.Module:
    return CourseCNN(
        input_shape,
        num_classes,
        conv_channels=[cfg["channels"]] * depth,
        fc_hidden=cfg["fc_hidden"],
        dropout=0.0,
        batch_norm=False,
        activation="relu",
    )


def _tensors(dataset: datasets.Dataset, cfg: dict[str, Any]):
    """Float images standardised with the training set's channel statistics."""
    mean = torch.tensor(dataset.manifest["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(dataset.manifest["std"]).view(1, -1, 1, 1)

    def prep(x: np.ndarray, limit: int) -> torch.Tensor:
        x = x[:limit] if limit else x
        return (torch.from_numpy(x).float() / 255 - mean) / std

    return (
        prep(dataset.x_train, cfg["train_samples"]),
        torch.from_numpy(dataset.y_train[: cfg["train_samples"] or None]),
        prep(dataset.x_test, cfg["test_samples"]),
        torch.from_numpy(dataset.y_test[: cfg["test_samples"] or None]),
    )


def train_and_time(
    model: nn.Module, mode: Mode, tensors, cfg: dict[str, Any], fused_layers: int
) -> dict[str, Any]:
    device = torch.device(mode.device)
    x_train, y_train, x_test, y_test = (t.to(device) for t in tensors)
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    order = torch.Generator().manual_seed(cfg["seed"])  # the same batches for every mode
    timer = StepTimer(device)
    step, train_loss = 0, math.nan
    start = time.perf_counter()
    with torch.backends.cudnn.flags(enabled=mode.cudnn, allow_tf32=cfg["tf32"]):
        model.train()
        for epoch in range(cfg["epochs"]):
            perm = torch.randperm(len(x_train), generator=order).to(device)
            losses = torch.zeros((), device=device)
            for idx in perm.split(cfg["batch_size"]):
                x, y = x_train[idx], y_train[idx]  # the batch, outside the timed spans
                timed = step >= cfg["warmup_steps"]
                with timer.span("forward", timed):
                    loss = F.cross_entropy(model(x), y)
                with timer.span("backward", timed):
                    loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses += loss.detach() * len(y)
                step += 1
            train_loss = losses.item() / len(x_train)
            log.info("%s epoch %d/%d: train loss %.4f", mode.title, epoch + 1, cfg["epochs"],
                     train_loss)  # fmt: skip
        accuracy = _accuracy(model, x_test, y_test)
    times = timer.totals()
    return {
        "status": "ok",
        "reason": None,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "fused_layers": fused_layers,
        "epochs": cfg["epochs"],
        "steps": step,
        "timed_steps": max(0, step - cfg["warmup_steps"]),
        "forward_time_s": times["forward"],
        "backward_time_s": times["backward"],
        "train_loss": train_loss,
        "test_accuracy": accuracy,
        "wall_time_s": time.perf_counter() - start,
    }


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = sum(
        (model(xb).argmax(1) == yb).sum().item()
        for xb, yb in zip(x.split(EVAL_BATCH), y.split(EVAL_BATCH), strict=True)
    )
    return correct / len(y)


def run(
    cfg: dict[str, Any], out_dir: Path, *, data_dir: Path, threads: int, **_: Any
) -> dict[str, Any]:
    torch.set_num_threads(threads)
    try:
        dataset = datasets.load(data_dir, cfg["dataset"])
    except datasets.DataUnavailable as e:
        dataset, tensors, unavailable = None, None, f"dataset {cfg['dataset']} unavailable: {e}"
    else:
        tensors, unavailable = _tensors(dataset, cfg), None
    rows: list[dict[str, Any]] = []
    repeat_rows: list[dict[str, Any]] = []
    for depth in cfg["depths"]:
        baseline = None
        if dataset is not None:
            torch.manual_seed(cfg["seed"])
            shape, classes = dataset.manifest["input_shape"], dataset.manifest["num_classes"]
            baseline = build_cnn(depth, cfg, shape, classes)
        depth_rows, runnable = {}, []
        for name in cfg["modes"]:
            mode = MODES[name]
            row = {"depth": depth, "mode": name, "title": mode.title, "device": mode.device,
                   "threads": threads if mode.device == "cpu" else None}  # fmt: skip
            if unavailable:
                row |= {"status": "skipped", "reason": unavailable}
            elif mode.device == "cuda" and not torch.cuda.is_available():
                reason = f"'{name}' needs a CUDA GPU; this host has none"
                row |= {"status": "skipped", "reason": reason}
            else:
                runnable.append(name)
            depth_rows[name] = row
        measured = _repeat_modes(depth, runnable, baseline, tensors, cfg)
        for name, row in depth_rows.items():
            if name in measured:
                results = measured[name]
                if results[-1]["status"] != "ok":
                    row |= {k: results[-1][k] for k in ("status", "reason")}
                else:
                    row |= _summarise(results)
                    repeat_rows += [
                        {"depth": depth, "mode": name, "device": row["device"]}
                        | {k: r[k] for k in REPEAT_COLUMNS if k in r}
                        for r in results
                    ]
            rows.append(row)
    write_csv(out_dir / "results.csv", rows, COLUMNS)
    write_csv(out_dir / "repeats.csv", repeat_rows, REPEAT_COLUMNS)
    save_figure(_figure(rows, cfg["depths"], cfg["modes"]), out_dir / "times.png")
    data = None
    if dataset is not None:
        data = {k: dataset.manifest[k] for k in ("name", "synthetic", "source", "input_shape")}
        data |= {"n_train": len(tensors[0]), "n_test": len(tensors[2])}
    return {
        "rows": rows,
        "data": data,
        "cudnn_version": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "repeats": cfg["repeats"],
        "verdicts": verdicts(rows, repeat_rows, cfg["depths"], cfg["modes"]),
    }


def _repeat_modes(
    depth: int, names: list[str], baseline: nn.Module | None, tensors, cfg: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """Each mode's results, one per repeat: the modes take turns within a repeat, starting one
    further along the list each repeat. A mode that fails keeps its failed result last and
    runs no more."""
    measured: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for repeat in range(cfg["repeats"]):
        shift = repeat % len(names) if names else 0
        turns = [
            n
            for n in names[shift:] + names[:shift]
            if not measured[n] or measured[n][-1]["status"] == "ok"
        ]
        for order, name in enumerate(turns):
            result = _train_mode(depth, name, copy.deepcopy(baseline), tensors, cfg, repeat)
            if result["status"] != "ok":
                result["reason"] = f"repeat {repeat + 1}/{cfg['repeats']}: {result['reason']}"
            measured[name].append(result | {"repeat": repeat, "order": order})
    return measured


def _summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """A mode's row from its repeats: means, and the half-widths of their 95% intervals."""
    first = results[0]
    row = {k: first[k] for k in ("status", "reason", "device_name", "fused_layers", "epochs",
                                 "steps", "timed_steps")}  # fmt: skip
    row["repeats"] = len(results)
    for key in WITH_INTERVAL:
        estimate = stats.mean_interval([r[key] for r in results])
        row[key], row[f"{key}_ci95"] = estimate.mean, estimate.half_width
    for key in ("train_loss", "wall_time_s"):
        row[key] = float(np.mean([r[key] for r in results]))
    return row


def verdicts(
    rows: list[dict[str, Any]],
    repeat_rows: list[dict[str, Any]],
    depths: list[int],
    modes: list[str],
) -> dict[str, Any]:
    """Per depth: cudnn time / fused time, forward and backward, with the interval of the
    ratio over the repeats; and every mode's test accuracy in percent."""
    by_depth = {}
    for depth in depths:

        def values(mode: str, key: str, depth: int = depth) -> list[float]:
            return [r[key] for r in repeat_rows if (r["depth"], r["mode"]) == (depth, mode)]

        not_measured = [
            f"{r['mode']}: {r['status']} ({r['reason']})"
            for r in rows
            if r["depth"] == depth and r["mode"] in ("cudnn", "fused") and r["status"] != "ok"
        ] + [f"{m}: not among the modes" for m in ("cudnn", "fused") if m not in modes]
        speedup = {}
        for part in ("forward", "backward"):
            cudnn, fused = values("cudnn", f"{part}_time_s"), values("fused", f"{part}_time_s")
            result = stats.ratio(cudnn, fused) if cudnn and fused else None
            speedup[part] = {
                "value": None if result is None else result.value,
                "low": None if result is None else result.low,
                "high": None if result is None else result.high,
                "within_noise": None if result is None else result.within_noise,
                "n_cudnn": len(cudnn),
                "n_fused": len(fused),
            }
            if result is None:
                speedup[part]["reason"] = "; ".join(not_measured) or "no positive times"
        accuracy = {}
        for mode in modes:
            estimate = stats.mean_interval([100 * a for a in values(mode, "test_accuracy")])
            accuracy[mode] = None if estimate is None else {
                "mean": estimate.mean, "low": estimate.low, "high": estimate.high,
                "n": estimate.n,
            }  # fmt: skip
        by_depth[str(depth)] = {
            "fused_vs_cudnn": {"forward": speedup["forward"], "backward": speedup["backward"]},
            "test_accuracy_percent": accuracy,
        }
    return {"convention": SPEEDUP_CONVENTION, "by_depth": by_depth}


def _train_mode(
    depth: int, name: str, model: nn.Module, tensors, cfg, repeat: int = 0
) -> dict[str, Any]:
    """One repeat's numbers of a row; a failure (the extension does not build, say) becomes
    the row's reason, so the other rows are kept."""
    log.info("depth %d, %s, repeat %d/%d", depth, MODES[name].title, repeat + 1, cfg["repeats"])
    try:
        fused_layers = 0
        if MODES[name].fused:
            load_extension()  # compiled (or loaded from torch's cache) before the clock runs
            fused_layers = fuse_conv_relu(model)
        return train_and_time(model, MODES[name], tensors, cfg, fused_layers)
    except Exception as e:
        log.error("depth %d %s failed:\n%s", depth, name, traceback.format_exc())
        return {"status": "failed", "reason": f"{type(e).__name__}: {e}"}


def _figure(rows: list[dict[str, Any]], depths: list[int], modes: list[str]):
    """Forward and backward time per mode (log scale: the modes differ by orders of
    magnitude), one panel per depth; test accuracy, or why there is none, above each mode."""
    fig = new_figure(5 * len(depths), 4.5)
    axes = fig.subplots(1, len(depths), squeeze=False)[0]
    for ax, depth in zip(axes, depths, strict=True):
        by_mode = {r["mode"]: r for r in rows if r["depth"] == depth}
        xs = range(len(modes))
        shortest = math.inf
        for offset, part in ((-0.2, "forward"), (0.2, "backward")):
            heights = [by_mode[m].get(f"{part}_time_s") or 0 for m in modes]
            errors = [by_mode[m].get(f"{part}_time_s_ci95") or 0 for m in modes]
            ax.bar([x + offset for x in xs], heights, 0.4, yerr=errors, capsize=2, label=part)
            shortest = min([shortest, *(h for h in heights if h > 0)])
        for x, m in zip(xs, modes, strict=True):
            r = by_mode[m]
            text = f"acc {r['test_accuracy']:.1%}" if r["status"] == "ok" else r["status"]
            ax.annotate(text, (x, 1.01), xycoords=("data", "axes fraction"), ha="center",
                        va="bottom", fontsize=8)  # fmt: skip
        if math.isfinite(shortest):  # bars start at 0, which a log axis can't show
            ax.set_yscale("log")
            ax.set_ylim(bottom=shortest / 3)
        ax.set_xticks(list(xs), [MODES[m].title for m in modes], rotation=20, ha="right")
        ax.set_ylabel("s, summed over timed steps (mean, 95% interval)")
        ax.set_title(f"{depth} conv layers", pad=16)
        ax.legend(fontsize=8)
    return fig
