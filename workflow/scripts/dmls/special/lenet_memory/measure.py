"""D1: LeNet-5's parameters and training memory, estimated in closed form and measured.

The network is models.LeNet5: LeCun et al. (1998) on 1×32×32 input, but with every C3 map
connected to every S2 map (no sparse connection table), average pooling without trainable
coefficients, tanh (configurable), and a Linear(84, 10) output instead of the RBF layer.

Estimate = weights + optimizer state + gradients + activations, P parameters:
- fp32: weights 4P, gradients 4P. fp16 mixed precision with fp32 master weights (the ZeRO
  paper's accounting): an fp16 working copy 2P + an fp32 master copy 4P, fp16 gradients 2P.
- Optimizer state in fp32: AdamW 8P (first and second moments), SGD with momentum 4P.
- Activations, per sample (× batch × 4 or 2 bytes), with a "block" being a conv or linear layer
  and the activation/pooling after it:
  none: the input and every layer's output are kept for the backward;
  selective: the input and the conv/linear outputs are kept; the activations and poolings,
  cheap and parameter-free, are recomputed in the backward;
  full: only each block's input is kept; each block is recomputed in the backward.
  Recomputation needs working memory while a block is recomputed: the largest block's
  recomputed outputs are added once (`recompute_working_bytes`).
Measured: the same training steps (batch of random images, since memory does not depend on
the values), with the recomputation policies implemented through torch.utils.checkpoint:
selective as selective activation checkpointing that must save the conv/linear outputs, full as
one checkpoint per block. CPU memory is the profiler's (profile_memory=True) account of every
allocation and free inside the measured window; GPU memory is torch.cuda.max_memory_allocated.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from dmls.files import new_figure, save_figure, write_csv
from dmls.training.models import ACTIVATIONS, LeNet5

log = logging.getLogger(__name__)

INPUT_SHAPE = (1, 32, 32)
NUM_CLASSES = 10
# LeNet-5's weighted layers, C3 fully connected to S2 as in models.LeNet5: (layer, in, out,
# kernel), kernel None for a fully connected layer.
LENET5_LAYERS = (
    ("conv1", 1, 6, 5), ("conv2", 6, 16, 5), ("conv3", 16, 120, 5),
    ("fc1", 120, 84, None), ("fc2", 84, 10, None),
)  # fmt: skip
PRECISION_BYTES = {"fp32": 4, "fp16": 2}
MASTER_BYTES = 4  # fp32 master weights, and every optimizer state, are fp32
OPTIMIZER_STATES = {"adamw": 2, "sgd": 1}  # fp32 tensors of P elements each
SGD_MOMENTUM = 0.9
RECOMPUTE = ("none", "selective", "full")
# Ops whose outputs selective recomputation keeps: the convolutions and the linear layers.
SAVED_OPS = (torch.ops.aten.convolution.default, torch.ops.aten.addmm.default)

ESTIMATE_COLUMNS = (
    "optimizer", "precision", "recompute", "parameters", "weights_bytes", "master_weights_bytes",
    "gradients_bytes", "optimizer_state_bytes", "activations_stored_bytes",
    "recompute_working_bytes", "total_bytes",
)  # fmt: skip
MEASURED_COLUMNS = (
    "device", "optimizer", "precision", "recompute", "status", "reason", "weights_bytes",
    "gradients_bytes", "optimizer_state_bytes", "activations_bytes", "peak_bytes", "other_bytes",
    "peak_reserved_bytes", "estimate_total_bytes", "difference_bytes", "measured_over_estimate",
)  # fmt: skip
ACTIVATION_COLUMNS = (
    "tensor", "kind", "block", "shape", "elements_per_sample", "kept_none", "kept_selective",
    "kept_full",
)  # fmt: skip


# --------------------------------------------------------------------------- parameters
def closed_form_parameters() -> list[dict[str, Any]]:
    """Weights + biases per layer from the paper's description (conv: (in·k·k + 1)·out)."""
    rows = []
    for name, c_in, c_out, k in LENET5_LAYERS:
        if k is None:
            formula, count = f"({c_in} + 1) × {c_out}", (c_in + 1) * c_out
        else:
            formula, count = f"({c_in} × {k} × {k} + 1) × {c_out}", (c_in * k * k + 1) * c_out
        rows.append({"layer": name, "formula": formula, "closed_form": count})
    return rows


def parameter_table(model: nn.Module) -> list[dict[str, Any]]:
    """The closed form next to the parameters the model really has, layer by layer."""
    layers = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    closed = closed_form_parameters()
    if len(layers) != len(closed):
        raise ValueError(f"the model has {len(layers)} conv/linear layers, LeNet-5 has 5")
    return [
        row | {"model": sum(p.numel() for p in layer.parameters())}
        for row, layer in zip(closed, layers, strict=True)
    ]


# --------------------------------------------------------------------------- activations
def layer_blocks(model: LeNet5) -> list[nn.Sequential]:
    """The model's layers cut before each conv/linear layer: (conv1, act, pool), (conv2, act,
    pool), (conv3, act, flatten), (fc1, act), (fc2). The unit of full recomputation."""
    blocks: list[list[nn.Module]] = []
    for layer in [*model.features, *model.classifier]:
        if isinstance(layer, nn.Conv2d | nn.Linear) or not blocks:
            blocks.append([])
        blocks[-1].append(layer)
    return [nn.Sequential(*b) for b in blocks]


def activation_table(model: LeNet5) -> list[dict[str, Any]]:
    """Every tensor the forward produces (per sample) and whether each policy keeps it."""
    rows: list[dict[str, Any]] = [
        {"tensor": "input", "kind": "input", "block": 1, "shape": INPUT_SHAPE}
    ]
    x = torch.zeros(1, *INPUT_SHAPE)
    with torch.no_grad():
        for b, block in enumerate(layer_blocks(model), start=1):
            for layer in block:
                x = layer(x)
                kind = (
                    "view"
                    if isinstance(layer, nn.Flatten)
                    else "conv/linear"
                    if isinstance(layer, nn.Conv2d | nn.Linear)
                    else "activation"
                    if isinstance(layer, tuple(ACTIVATIONS.values()))
                    else "pooling"
                )
                rows.append(
                    {
                        "tensor": f"{type(layer).__name__} (block {b})",
                        "kind": kind,
                        "block": b,
                        "shape": tuple(x.shape[1:]),
                    }
                )
    for i, row in enumerate(rows):
        last_of_block = i + 1 < len(rows) and rows[i + 1]["block"] != row["block"]
        row["elements_per_sample"] = math.prod(row["shape"])
        row["shape"] = "×".join(map(str, row["shape"]))
        row["kept_none"] = row["kind"] != "view"  # a view shares the storage of its base
        row["kept_selective"] = row["kind"] in ("input", "conv/linear")
        row["kept_full"] = row["kind"] == "input" or last_of_block  # the next block's input
    return rows


def activation_elements(table: list[dict[str, Any]], recompute: str) -> tuple[int, int]:
    """(kept from forward to backward, working set while one block is recomputed) elements
    per sample."""
    kept = sum(r["elements_per_sample"] for r in table if r[f"kept_{recompute}"])
    per_block: dict[int, int] = {}
    for r in table:
        if r["kind"] in ("input", "view") or recompute == "none":
            continue
        if recompute == "full" or not r[f"kept_{recompute}"]:
            per_block[r["block"]] = per_block.get(r["block"], 0) + r["elements_per_sample"]
    return kept, max(per_block.values(), default=0)


def estimate(
    parameters: int,
    table: list[dict[str, Any]],
    optimizer: str,
    precision: str,
    recompute: str,
    batch_size: int,
) -> dict[str, Any]:
    """The closed-form training memory of one combination, by component, in bytes."""
    width = PRECISION_BYTES[precision]
    kept, working = activation_elements(table, recompute)
    row: dict[str, Any] = {
        "optimizer": optimizer,
        "precision": precision,
        "recompute": recompute,
        "parameters": parameters,
        "weights_bytes": width * parameters,
        "master_weights_bytes": MASTER_BYTES * parameters if precision != "fp32" else 0,
        "gradients_bytes": width * parameters,
        "optimizer_state_bytes": OPTIMIZER_STATES[optimizer] * MASTER_BYTES * parameters,
        "activations_stored_bytes": kept * batch_size * width,
        "recompute_working_bytes": working * batch_size * width,
    }
    row["total_bytes"] = sum(v for k, v in row.items() if k.endswith("_bytes"))
    return row


# --------------------------------------------------------------------------- measurement
class CpuMeter:
    """CPU memory as the profiler sees it: every allocation (+) and free (-) while open, so
    the counts start at zero when the window opens."""

    def __enter__(self) -> CpuMeter:
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()
        return self

    def mark(self, name: str) -> None:
        with record_function(f"mark:{name}"):
            pass

    def __exit__(self, *exc) -> None:
        self._profile.__exit__(*exc)

    def readings(self) -> tuple[int, dict[str, int], None]:
        """(peak bytes, bytes in use at each mark, reserved bytes: none on the CPU)."""
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.json"
            self._profile.export_chrome_trace(str(trace))
            events = json.loads(trace.read_text())["traceEvents"]
        timeline = sorted(
            (e["ts"], 1, e["args"]["Bytes"])
            for e in events
            if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0
        )
        timeline += [
            (e["ts"], 0, e["name"][5:])
            for e in events
            if str(e.get("name", "")).startswith("mark:")
        ]
        in_use, peak, marks = 0, 0, {}
        for _, is_memory, value in sorted(timeline, key=lambda t: t[:2]):
            if is_memory:
                in_use += value
                peak = max(peak, in_use)
            else:
                marks[value] = in_use
        return peak, marks, None


class CudaMeter:
    """GPU memory from the caching allocator's counters, relative to when the window opens."""

    marks: dict[str, int]

    def __init__(self, device: torch.device) -> None:
        self.device, self.marks = device, {}

    def __enter__(self) -> CudaMeter:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        return self

    def mark(self, name: str) -> None:
        self.marks[name] = torch.cuda.memory_allocated(self.device) - self.base

    def __exit__(self, *exc) -> None:
        torch.cuda.synchronize(self.device)

    def readings(self) -> tuple[int, dict[str, int], int]:
        peak = torch.cuda.max_memory_allocated(self.device) - self.base
        return peak, dict(self.marks), torch.cuda.max_memory_reserved(self.device)


def _keep_conv_and_linear_outputs(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def recomputing_forward(model: LeNet5, recompute: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The model's forward under a recomputation policy (see the module docstring)."""
    if recompute == "none":
        return model
    if recompute == "selective":
        context = functools.partial(
            create_selective_checkpoint_contexts, _keep_conv_and_linear_outputs
        )
        return lambda x: checkpoint(model, x, use_reentrant=False, context_fn=context)
    blocks = layer_blocks(model)

    def full(x: torch.Tensor) -> torch.Tensor:
        for block in blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return x

    return full


def measure(
    device: torch.device, optimizer: str, precision: str, recompute: str, cfg: dict[str, Any]
) -> dict[str, Any]:
    """Train LeNet-5 for cfg['steps'] steps inside a memory window; the peak and, at the last
    step, the bytes of weights, gradients, optimizer state and what the forward kept."""
    meter = CudaMeter(device) if device.type == "cuda" else CpuMeter()
    batch = cfg["batch_size"]
    inputs = torch.Generator().manual_seed(cfg["seed"])
    with meter:
        torch.manual_seed(cfg["seed"])
        model = LeNet5(INPUT_SHAPE, NUM_CLASSES, cfg["activation"]).to(device)
        forward = recomputing_forward(model, recompute)
        opt: torch.optim.Optimizer
        if optimizer == "adamw":
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=SGD_MOMENTUM)
        scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        for step in range(cfg["steps"]):
            meter.mark(f"before_forward_{step}")
            x = torch.randn(batch, *INPUT_SHAPE, generator=inputs).to(device)
            y = torch.randint(NUM_CLASSES, (batch,), generator=inputs).to(device)
            with torch.autocast(device.type, dtype=torch.float16, enabled=precision == "fp16"):
                loss = F.cross_entropy(forward(x), y)
            meter.mark(f"after_forward_{step}")
            scaler.scale(loss).backward()
            gradients = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            del x, y, loss
        states = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
        # AdamW keeps its `step` counters on the CPU even for CUDA parameters: count what is
        # on the measured device.
        optimizer_state = sum(t.nbytes for t in states if t.device.type == device.type)
        weights = sum(p.nbytes for p in model.parameters())
    peak, marks, reserved = meter.readings()
    last = cfg["steps"] - 1
    activations = marks[f"after_forward_{last}"] - marks[f"before_forward_{last}"]
    return {
        "status": "ok",
        "reason": None,
        "weights_bytes": weights,
        "gradients_bytes": gradients,
        "optimizer_state_bytes": optimizer_state,
        "activations_bytes": activations,
        "peak_bytes": peak,
        "other_bytes": peak - weights - gradients - optimizer_state - activations,
        "peak_reserved_bytes": reserved,
    }


def cuda_library_workspaces(cfg: dict[str, Any]) -> int:
    """Run each precision under each recomputation policy once, unmeasured, so the workspaces
    CUDA libraries keep for the process's lifetime (cuBLAS's) exist before any measured
    window; return their bytes. Otherwise the first measured combination that needs one alone
    would carry it: full recomputation runs the Linear layers' forward again inside the
    backward, on autograd's own thread, whose first GEMM there allocates a cuBLASLt workspace
    of its own (1 MiB on an H200 with torch 2.11: bench/lenet_recompute_memory.py), which
    raised AdamW fp32's full-recomputation peak 43% above its peak without recomputation
    while every later combination's full recomputation lowered its peak."""
    cuda = torch.device("cuda")
    for precision, recompute in itertools.product(cfg["precisions"], cfg["recompute"]):
        measure(cuda, cfg["optimizers"][0], precision, recompute, cfg)
    return torch.cuda.memory_allocated(cuda)


# --------------------------------------------------------------------------- study
def run(cfg: dict[str, Any], out_dir: Path, *, threads: int, **_: Any) -> dict[str, Any]:
    torch.set_num_threads(threads)
    model = LeNet5(INPUT_SHAPE, NUM_CLASSES, cfg["activation"])
    parameters = parameter_table(model)
    n_params = sum(p.numel() for p in model.parameters())
    table = activation_table(model)
    combos = list(itertools.product(cfg["optimizers"], cfg["precisions"], cfg["recompute"]))
    estimates = {c: estimate(n_params, table, *c, cfg["batch_size"]) for c in combos}
    workspaces = cuda_library_workspaces(cfg) if torch.cuda.is_available() else None
    rows: list[dict[str, Any]] = []
    for device_name in ("cpu", "cuda"):
        for combo in combos:
            row = dict(
                zip(
                    ("device", "optimizer", "precision", "recompute"),
                    (device_name, *combo),
                    strict=True,
                )
            )
            if device_name == "cuda" and not torch.cuda.is_available():
                row |= {"status": "skipped", "reason": "no CUDA device on this host"}
            else:
                log.info("measuring %s", " ".join(map(str, row.values())))
                row |= measure(torch.device(device_name), *combo, cfg)
                total = estimates[combo]["total_bytes"]
                row |= {
                    "estimate_total_bytes": total,
                    "difference_bytes": row["peak_bytes"] - total,
                    "measured_over_estimate": row["peak_bytes"] / total,
                }
            rows.append(row)
    write_csv(out_dir / "parameters.csv", parameters, ("layer", "formula", "closed_form", "model"))
    write_csv(out_dir / "activations.csv", table, ACTIVATION_COLUMNS)
    write_csv(out_dir / "estimate.csv", estimates.values(), ESTIMATE_COLUMNS)
    write_csv(out_dir / "measured.csv", rows, MEASURED_COLUMNS)
    save_figure(_figure(list(estimates.values()), rows), out_dir / "memory.png")
    return {
        "rows": rows,
        "variant": __doc__.split("\n\n")[1].replace("\n", " "),
        "parameters": {
            "layers": parameters,
            "closed_form_total": sum(r["closed_form"] for r in parameters),
            "model_total": n_params,
        },
        "estimate": list(estimates.values()),
        "cuda_library_workspace_bytes": workspaces,
    }


def _figure(estimates: list[dict[str, Any]], measured: list[dict[str, Any]]):
    """Stacked estimate per combination, with the measured peaks (CPU, GPU) as markers."""
    parts = ("weights_bytes", "master_weights_bytes", "gradients_bytes", "optimizer_state_bytes",
             "activations_stored_bytes", "recompute_working_bytes")  # fmt: skip
    fig = new_figure(max(8, 0.9 * len(estimates)), 5)
    ax = fig.add_subplot()
    xs = range(len(estimates))
    bottom = [0.0] * len(estimates)
    for part in parts:
        heights = [e[part] / 1024 for e in estimates]
        ax.bar(xs, heights, 0.6, bottom=bottom, label=part.removesuffix("_bytes").replace("_", " "))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    key = ("optimizer", "precision", "recompute")
    for device, marker in (("cpu", "o"), ("cuda", "D")):
        peaks = {
            tuple(r[k] for k in key): r["peak_bytes"] / 1024
            for r in measured
            if r["device"] == device and r["status"] == "ok"
        }
        points = [
            (x, peaks[tuple(e[k] for k in key)])
            for x, e in zip(xs, estimates, strict=True)
            if tuple(e[k] for k in key) in peaks
        ]
        if points:
            ax.plot(
                *zip(*points, strict=True),
                marker,
                color="black" if device == "cpu" else "red",
                label=f"measured peak, {device}",
            )
    ax.set_xticks(list(xs), ["\n".join(e[k] for k in key) for e in estimates], fontsize=7)
    ax.set_ylabel("KiB")
    ax.set_title("LeNet-5 training memory, batch 8, 32×32: estimate (bars) and measured peaks")
    ax.legend(fontsize=7, ncols=2)
    return fig
