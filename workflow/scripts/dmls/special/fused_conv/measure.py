"""Study C: Conv2d + ReLU through cuDNN, through the fused kernel, without cuDNN, on the CPU.

The networks are the course CNN (models.CourseCNN) with `depth` 3×3 conv layers of `channels`
channels, each layer its own weights, and no batch norm, so every conv feeds its ReLU directly;
the fused variant swaps each Conv2d + ReLU for FusedConvReLU. C asks two things, measured apart
because they cost very differently (bench/fused_conv_time.py: cuDNN off steps 10-50x slower):

- Speed, per training step. Every mode trains `warmup_steps` + `timed_steps` steps (Adam) from
  the same weights over the same batches, `repeats` times; the modes take turns within a repeat
  (the order rotates from one repeat to the next), so drift of the clocks or the host hits every
  mode alike. Forward (model and loss) and backward times are summed over the timed steps, with
  CUDA events on the GPU and perf_counter on the CPU, and divided by them (ms per step); the
  optimizer step is in neither. repeats.csv keeps each repeat's numbers.
- Accuracy. The `accuracy_modes` (default: cuDNN and the fused kernel, whose question it is)
  train `epochs` over the whole training set from each of `accuracy_seeds` seeds' weights and
  batch order (seed, seed + 1, ...), every mode from the same seed's weights, and are tested on
  the test set. accuracy.csv keeps each training. The other modes are timed only: their network
  and arithmetic are cuDNN's, and their full trainings would be most of the study's time.

results.csv gives per depth and mode the means and the half-widths of their 95% Student-t
intervals (`_ci95`). The summary's `verdicts` give, per depth, the fused kernel against cuDNN as
cudnn time / fused time (> 1: the fused kernel is faster), the ratio of the geometric means over
the repeats with Welch's 95% interval on the logs (dmls.stats.ratio); each accuracy mode's test
accuracy in percent with its interval over the seeds; and fused − cuDNN accuracy in points with
Welch's interval over the seeds (dmls.stats.difference).
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
from dmls.special.fused_conv.kernels.fused_conv_relu import fuse_conv_relu, load_extension
from dmls.training.models import CourseCNN

log = logging.getLogger(__name__)

EVAL_BATCH = 1000
# Per depth and mode: speed as means over the repeats of ms per timed step, accuracy as the
# mean over the seeds; `_ci95`: the half-width of the mean's 95% interval (None with one).
# `accuracy_reason`: why a mode has no accuracy (timed only, or its training failed).
COLUMNS = (
    "depth", "mode", "title", "status", "reason", "device", "device_name", "fused_layers",
    "repeats", "timed_steps", "forward_ms", "forward_ms_ci95", "backward_ms",
    "backward_ms_ci95", "accuracy_seeds", "epochs", "steps", "train_loss", "test_accuracy",
    "test_accuracy_ci95", "accuracy_reason", "wall_time_s", "threads",
)  # fmt: skip
# One row per depth, mode and repeat of the speed part; `order`: the mode's turn within the
# repeat (0 = first); times in ms per timed step.
REPEAT_COLUMNS = (
    "depth", "mode", "repeat", "order", "device", "timed_steps", "forward_ms", "backward_ms",
    "wall_time_s",
)  # fmt: skip
# One row per depth, mode and seed of the accuracy part: a training of `epochs` epochs.
ACCURACY_COLUMNS = (
    "depth", "mode", "seed", "device", "epochs", "steps", "train_loss", "test_accuracy",
    "wall_time_s",
)  # fmt: skip
TIMED_ONLY = "timed only: not among the config's accuracy_modes"
SPEEDUP_CONVENTION = (
    "vs_cudnn[mode][part]: value = the cudnn mode's time per step over that mode's, repeat by "
    "repeat (the modes took turns within each repeat), as a geometric mean over the repeats, "
    "so > 1 means the mode is faster than cuDNN; low, high: its 95% interval (Student's t on "
    "the logs of the per-repeat ratios, dmls.stats.paired_ratio); within_noise: the interval "
    "holds 1; cudnn_ms, mode_ms: the geometric means of the two times. "
    "test_accuracy_percent: each accuracy mode's mean over the seeds and its 95% Student-t "
    "interval, in percent; fused_minus_cudnn_points: the difference of those means in "
    "percentage points with Welch's 95% interval over the seeds (dmls.stats.difference)"
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


def training_steps(n_train: int, cfg: dict[str, Any]) -> int:
    """The steps of one accuracy training: `epochs` over `n_train` images in batches of
    `batch_size`, the last batch of each epoch short."""
    return cfg["epochs"] * math.ceil(n_train / cfg["batch_size"])


def train(
    model: nn.Module,
    mode: Mode,
    tensors,
    cfg: dict[str, Any],
    *,
    seed: int,
    steps: int | None = None,
    timed_from: int | None = None,
) -> dict[str, Any]:
    """Train `model` with Adam on batches in `seed`'s order: `steps` steps (epochs over the
    training set as many times as they need), timing forward and backward from step
    `timed_from` on; or, with `steps` None, the config's epochs, untimed, then test it."""
    device = torch.device(mode.device)
    x_train, y_train, x_test, y_test = (t.to(device) for t in tensors)
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    order = torch.Generator().manual_seed(seed)  # the same batches for every mode
    timer = StepTimer(device)
    total = steps if steps is not None else training_steps(len(x_train), cfg)
    step, epoch, train_loss = 0, 0, math.nan
    start = time.perf_counter()
    with torch.backends.cudnn.flags(enabled=mode.cudnn, allow_tf32=cfg["tf32"]):
        model.train()
        while step < total:
            perm = torch.randperm(len(x_train), generator=order).to(device)
            losses, seen = torch.zeros((), device=device), 0
            for idx in perm.split(cfg["batch_size"])[: total - step]:
                x, y = x_train[idx], y_train[idx]  # the batch, outside the timed spans
                timed = timed_from is not None and step >= timed_from
                with timer.span("forward", timed):
                    loss = F.cross_entropy(model(x), y)
                with timer.span("backward", timed):
                    loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses += loss.detach() * len(y)
                seen += len(y)
                step += 1
            epoch += 1
            train_loss = losses.item() / seen
            if steps is None:
                log.info(
                    "%s epoch %d/%d: train loss %.4f", mode.title, epoch, cfg["epochs"], train_loss
                )
        accuracy = _accuracy(model, x_test, y_test) if steps is None else None
    times = timer.totals()
    timed_steps = max(0, step - timed_from) if timed_from is not None else 0
    return {
        "status": "ok",
        "reason": None,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "steps": step,
        "timed_steps": timed_steps,
        "forward_ms": 1e3 * times["forward"] / timed_steps if timed_steps else None,
        "backward_ms": 1e3 * times["backward"] / timed_steps if timed_steps else None,
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
    unavailable: str | None
    try:
        dataset = datasets.load(data_dir, cfg["dataset"])
    except datasets.DataUnavailable as e:
        dataset, tensors, unavailable = None, None, f"dataset {cfg['dataset']} unavailable: {e}"
    else:
        assert dataset is not None  # `load` returned it
        tensors, unavailable = _tensors(dataset, cfg), None
    rows: list[dict[str, Any]] = []
    repeat_rows: list[dict[str, Any]] = []
    accuracy_rows: list[dict[str, Any]] = []
    for depth in cfg["depths"]:
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
        build = _builder(depth, dataset, cfg)
        timed = _repeat_modes(depth, runnable, build, tensors, cfg)
        trained = _accuracy_trainings(
            depth, [m for m in runnable if m in cfg["accuracy_modes"]], build, tensors, cfg
        )
        for name, row in depth_rows.items():
            if name in timed:
                row |= _summarise(timed[name], trained.get(name))
                repeat_rows += [
                    {"depth": depth, "mode": name, "device": row["device"]}
                    | {k: r[k] for k in REPEAT_COLUMNS if k in r}
                    for r in timed[name]
                    if r["status"] == "ok"
                ]
                accuracy_rows += [
                    {"depth": depth, "mode": name, "device": row["device"]}
                    | {k: r[k] for k in ACCURACY_COLUMNS if k in r}
                    for r in trained.get(name, [])
                    if r["status"] == "ok"
                ]
            rows.append(row)
    write_csv(out_dir / "results.csv", rows, COLUMNS)
    write_csv(out_dir / "repeats.csv", repeat_rows, REPEAT_COLUMNS)
    write_csv(out_dir / "accuracy.csv", accuracy_rows, ACCURACY_COLUMNS)
    save_figure(_figure(rows, cfg["depths"], cfg["modes"]), out_dir / "times.png")
    data = None
    if dataset is not None:
        assert tensors is not None  # loaded with the dataset
        data = {k: dataset.manifest[k] for k in ("name", "synthetic", "source", "input_shape")}
        data |= {"n_train": len(tensors[0]), "n_test": len(tensors[2])}
    return {
        "rows": rows,
        "data": data,
        "cudnn_version": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "repeats": cfg["repeats"],
        "accuracy_seeds": cfg["accuracy_seeds"],
        "verdicts": verdicts(rows, repeat_rows, accuracy_rows, cfg),
    }


def _builder(depth: int, dataset: datasets.Dataset | None, cfg: dict[str, Any]):
    """A function of a seed giving that seed's network of `depth` layers (its weights)."""

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        assert dataset is not None  # built only for runnable modes: the dataset loaded
        shape, classes = dataset.manifest["input_shape"], dataset.manifest["num_classes"]
        return build_cnn(depth, cfg, shape, classes)

    return build


def _repeat_modes(
    depth: int, names: list[str], build, tensors, cfg: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """The speed part: each mode's results, one per repeat, all from the config seed's
    weights over its batches. The modes take turns within a repeat, starting one further
    along the list each repeat. A mode that fails keeps its failed result last and runs no
    more."""
    measured: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    if not names:
        return measured
    baseline = build(cfg["seed"])
    steps = cfg["warmup_steps"] + cfg["timed_steps"]
    for repeat in range(cfg["repeats"]):
        shift = repeat % len(names)
        turns = [
            n
            for n in names[shift:] + names[:shift]
            if not measured[n] or measured[n][-1]["status"] == "ok"
        ]
        for order, name in enumerate(turns):
            what = f"repeat {repeat + 1}/{cfg['repeats']}"
            model = copy.deepcopy(baseline)
            result = _train_mode(
                depth,
                name,
                model,
                tensors,
                cfg,
                what,
                seed=cfg["seed"],
                steps=steps,
                timed_from=cfg["warmup_steps"],
            )
            measured[name].append(result | {"repeat": repeat, "order": order})
    return measured


def _accuracy_trainings(
    depth: int, names: list[str], build, tensors, cfg: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """The accuracy part: each mode's full trainings, one per seed, every mode from that
    seed's weights over its batches. A mode that fails keeps its failed result last."""
    trained: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for k in range(cfg["accuracy_seeds"] if names else 0):
        seed = cfg["seed"] + k
        weights = build(seed)
        for name in names:
            if trained[name] and trained[name][-1]["status"] != "ok":
                continue
            what = f"accuracy seed {seed} ({k + 1}/{cfg['accuracy_seeds']})"
            result = _train_mode(depth, name, copy.deepcopy(weights), tensors, cfg, what, seed=seed)
            trained[name].append(result | {"seed": seed, "epochs": cfg["epochs"]})
    return trained


def _summarise(timed: list[dict[str, Any]], trained: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A mode's row: its speed (means over the repeats of ms per step, with the half-widths
    of their 95% intervals) and its accuracy (mean over the seeds), or why either is missing;
    the row failed where either part failed."""
    failed = [r for r in (timed[-1:] + (trained or [])[-1:]) if r["status"] != "ok"]
    first = timed[0]
    row: dict[str, Any] = {k: first.get(k) for k in ("device_name", "fused_layers", "timed_steps")}
    row |= {
        "status": "failed" if failed else "ok",
        "reason": "; ".join(r["reason"] for r in failed) or None,
    }
    ok = [r for r in timed if r["status"] == "ok"]
    row["repeats"] = len(ok)
    for key in ("forward_ms", "backward_ms"):
        estimate = stats.mean_interval([r[key] for r in ok])
        row[key] = None if estimate is None else estimate.mean
        row[f"{key}_ci95"] = None if estimate is None else estimate.half_width
    wall = sum(r.get("wall_time_s", 0.0) for r in timed + (trained or []))
    row["wall_time_s"] = wall
    if trained is None:
        return row | {"accuracy_reason": TIMED_ONLY}
    done = [r for r in trained if r["status"] == "ok"]
    estimate = stats.mean_interval([r["test_accuracy"] for r in done])
    row |= {
        "accuracy_seeds": len(done),
        "epochs": done[0]["epochs"] if done else None,
        "steps": done[0]["steps"] if done else None,
        "train_loss": float(np.mean([r["train_loss"] for r in done])) if done else None,
        "test_accuracy": None if estimate is None else estimate.mean,
        "test_accuracy_ci95": None if estimate is None else estimate.half_width,
    }
    if not done:
        row["accuracy_reason"] = trained[-1]["reason"]
    return row


def verdicts(
    rows: list[dict[str, Any]],
    repeat_rows: list[dict[str, Any]],
    accuracy_rows: list[dict[str, Any]],
    cfg: dict[str, Any],
) -> dict[str, Any]:
    """Per depth: every mode against cuDNN, forward and backward, as cuDNN's time per step over
    the mode's with the interval of the ratio over the repeats they took turns in; every
    accuracy mode's test accuracy in percent over the seeds; and fused − cudnn accuracy in
    points with its interval (SPEEDUP_CONVENTION). The answer reads these, computed once."""
    by_depth = {}
    modes = cfg["modes"]
    for depth in cfg["depths"]:

        def values(mode: str, key: str, table=repeat_rows, depth: int = depth) -> list[float]:
            return [r[key] for r in table if (r["depth"], r["mode"]) == (depth, mode)]

        vs_cudnn = {
            mode: {
                part: _against_cudnn(rows, repeat_rows, depth, mode, part)
                for part in ("forward", "backward")
            }
            for mode in modes
            if mode != "cudnn"
        }
        percent = {m: [100 * a for a in values(m, "test_accuracy", accuracy_rows)] for m in modes}
        accuracy = {}
        for mode in modes:
            estimate = stats.mean_interval(percent[mode])
            accuracy[mode] = (
                None
                if estimate is None
                else {
                    "mean": estimate.mean,
                    "low": estimate.low,
                    "high": estimate.high,
                    "n": estimate.n,
                }
            )
        points = stats.difference(percent.get("fused", []), percent.get("cudnn", []))
        by_depth[str(depth)] = {
            "vs_cudnn": vs_cudnn,
            "test_accuracy_percent": accuracy,
            "fused_minus_cudnn_points": None if points is None else {
                "value": points.value, "low": points.low, "high": points.high,
                "n_fused": points.n_a, "n_cudnn": points.n_b,
            },
        }  # fmt: skip
    return {"convention": SPEEDUP_CONVENTION, "by_depth": by_depth}


def _against_cudnn(
    rows: list[dict[str, Any]], repeat_rows: list[dict[str, Any]], depth: int, mode: str, part: str
) -> dict[str, Any]:
    """`mode` against cuDNN in `part` at `depth`: cuDNN's time over the mode's, repeat by
    repeat where both were timed (they took turns in it), with its interval (SPEEDUP_CONVENTION);
    why not, where a side has no time."""
    times = {
        m: {
            r["repeat"]: r[f"{part}_ms"]
            for r in repeat_rows
            if (r["depth"], r["mode"]) == (depth, m) and r.get(f"{part}_ms")
        }
        for m in ("cudnn", mode)
    }
    common = sorted(set(times["cudnn"]) & set(times[mode]))
    cudnn, other = [times["cudnn"][k] for k in common], [times[mode][k] for k in common]
    result = stats.paired_ratio(cudnn, other) if common else None
    if result is None:
        failed = [
            f"{r['mode']}: {r['status']} ({r['reason']})"
            for r in rows
            if r["depth"] == depth and r["mode"] in ("cudnn", mode) and r["status"] != "ok"
        ]
        return {"reason": "; ".join(failed) or f"cudnn or {mode} has no {part} time"}
    return {
        "value": result.value,
        "low": result.low,
        "high": result.high,
        "within_noise": result.within_noise,
        "n": result.n_a,
        "cudnn_ms": stats.geometric_mean(cudnn),
        "mode_ms": stats.geometric_mean(other),
    }


def _train_mode(
    depth: int, name: str, model: nn.Module, tensors, cfg, what: str, **how: Any
) -> dict[str, Any]:
    """One repeat's or one seed's numbers of a row (`how`: train's keywords); a failure (the
    extension does not build, say) becomes the row's reason, so the other rows are kept."""
    log.info("depth %d, %s, %s", depth, MODES[name].title, what)
    try:
        fused_layers = 0
        if MODES[name].fused:
            load_extension()  # compiled (or loaded from torch's cache) before the clock runs
            fused_layers = fuse_conv_relu(model)
        return train(model, MODES[name], tensors, cfg, **how) | {"fused_layers": fused_layers}
    except Exception as e:
        log.error("depth %d %s failed:\n%s", depth, name, traceback.format_exc())
        return {"status": "failed", "reason": f"{what}: {type(e).__name__}: {e}"}


def _figure(rows: list[dict[str, Any]], depths: list[int], modes: list[str]):
    """Forward and backward time per step and mode (log scale: the modes differ by orders of
    magnitude), one panel per depth; test accuracy, "timed only", or why there is none, above
    each mode."""
    fig = new_figure(5 * len(depths), 4.5)
    axes = fig.subplots(1, len(depths), squeeze=False)[0]
    for ax, depth in zip(axes, depths, strict=True):
        by_mode = {r["mode"]: r for r in rows if r["depth"] == depth}
        xs = range(len(modes))
        shortest = math.inf
        for offset, part in ((-0.2, "forward"), (0.2, "backward")):
            heights = [by_mode[m].get(f"{part}_ms") or 0 for m in modes]
            errors = [by_mode[m].get(f"{part}_ms_ci95") or 0 for m in modes]
            ax.bar([x + offset for x in xs], heights, 0.4, yerr=errors, capsize=2, label=part)
            shortest = min([shortest, *(h for h in heights if h > 0)])
        for x, m in zip(xs, modes, strict=True):
            r = by_mode[m]
            if r["status"] != "ok":
                text = r["status"]
            elif r.get("test_accuracy") is not None:
                text = f"acc {r['test_accuracy']:.1%}"
            else:
                text = "timed only"
            ax.annotate(
                text,
                (x, 1.01),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        if math.isfinite(shortest):  # bars start at 0, which a log axis can't show
            ax.set_yscale("log")
            ax.set_ylim(bottom=shortest / 3)
        ax.set_xticks(list(xs), [MODES[m].title for m in modes], rotation=20, ha="right")
        ax.set_ylabel("ms per training step (mean over repeats, 95% interval)")
        ax.set_title(f"{depth} conv layers", pad=16)
        ax.legend(fontsize=8)
    return fig
