"""D5 (the written assignment's question 6): static against dynamic computation graphs, measured.

The course CNN trains three ways on the same random batch (only time is measured, so the data
need not be real):
- eager: PyTorch's dynamic graph. Python runs `forward` every step and each op dispatches as it
  is reached; autograd records the graph of that one step as it goes. Nothing is captured.
- compile: `torch.compile`. TorchDynamo reads the Python bytecode on the first call, captures
  the tensor ops into FX graphs guarded by what it assumed (shapes, dtypes, Python values),
  and Inductor compiles them into fused kernels; a later call that passes the guards runs the
  compiled code. What it can't trace breaks the graph and runs as Python in between.
- export: `torch.export`. One whole static graph of ATen ops, captured ahead of time with the
  parameters lifted to inputs, or an error: it has no Python to fall back on.

Per device and mode, after one untimed eager step: the first call (capture and compiling
included) and the steady training step (forward, loss, backward, SGD step; median of `steps`
after `warmup_steps`, repeated `repeats` times: mean and 95% interval over the repeats), and
what was captured (graphs,
graph breaks, ops). Then a model whose branch depends on a tensor's value: what
`torch._dynamo.explain` says of it, the error `torch.export` gives, and the same model with
the branch written as `torch.cond`, which exports.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._dynamo  # here, not inside a timed first call: its import takes seconds
from torch import nn

from dmls.files import new_figure, save_figure, write_csv
from dmls.stats import mean_interval, ratio, verdict
from dmls.training import models

log = logging.getLogger(__name__)

MODES = ("eager", "compile", "export")
INPUT_SHAPE, NUM_CLASSES = (3, 32, 32), 10
RESULT_COLUMNS = (
    "device", "mode", "status", "reason", "first_call_s", "steady_step_ms", "steady_step_ms_ci95",
    "graphs", "graph_breaks", "ops", "captured",
)  # fmt: skip
CONTROL_COLUMNS = ("model", "capture", "outcome", "graphs", "graph_breaks", "ops", "detail")
# The lines of torch.export's error quoted in the report (the rest is debugging advice).
ERROR_LINES = 2


class Branchy(nn.Module):
    """A branch on a tensor's value: which layer runs depends on the data."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(width, width), nn.Linear(width, 4), nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.sum() > 0:
            return self.b(h)
        return self.c(h)


class BranchyCond(Branchy):
    """The same branch as `torch.cond`: both sides become subgraphs, chosen on the device."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return torch.cond(h.sum() > 0, lambda h: self.b(h), lambda h: self.c(h), (h,))


def course_cnn(cfg: dict[str, Any]) -> nn.Module:
    return models.course_cnn(INPUT_SHAPE, NUM_CLASSES, cfg["conv_channels"], cfg["fc_hidden"])


def _ops(graph: torch.fx.Graph) -> int:
    return sum(node.op == "call_function" for node in graph.nodes)


def prepare(mode: str, model: nn.Module, x: torch.Tensor) -> tuple[Callable, dict[str, Any]]:
    """What runs the forward in `mode`, and what was captured (the capture itself is timed
    with the first call)."""
    if mode == "eager":
        return model, {"graphs": 0, "graph_breaks": 0, "ops": None,
                       "captured": "nothing: each op runs as Python reaches it"}  # fmt: skip
    if mode == "compile":
        torch._dynamo.reset()  # nothing compiled before counts
        explained = torch._dynamo.explain(model)(x)
        torch._dynamo.reset()
        return torch.compile(model), {
            "graphs": explained.graph_count,
            "graph_breaks": explained.graph_break_count,
            "ops": explained.op_count,
            "captured": "FX graphs of the traced bytecode, guarded; compiled by Inductor",
        }
    exported = torch.export.export(model, (x,))
    return exported.module(), {
        "graphs": 1,
        "graph_breaks": 0,
        "ops": _ops(exported.graph),
        "captured": "one static graph of ATen ops, parameters lifted to inputs",
    }


def measure(mode: str, device: torch.device, cfg: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(cfg["seed"])
    model = course_cnn(cfg).to(device)
    x = torch.randn(cfg["batch_size"], *INPUT_SHAPE, device=device)
    y = torch.randint(0, NUM_CLASSES, (cfg["batch_size"],), device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    start = time.perf_counter()
    forward, captured = prepare(mode, model, x)
    capture = time.perf_counter() - start
    # The parameters the step updates (export's module holds its own, lifted, copies); built
    # outside the timed calls, as a training loop builds it once.
    optimizer = torch.optim.SGD(forward.parameters(), lr=cfg["lr"])

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(forward(x), y).backward()
        optimizer.step()

    sync()
    start = time.perf_counter()
    step()
    sync()
    first_call = capture + time.perf_counter() - start
    for _ in range(cfg["warmup_steps"]):
        step()
    medians = []
    for _ in range(cfg["repeats"]):
        times = []
        for _ in range(cfg["steps"]):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        medians.append(1000 * statistics.median(times))
    steady = mean_interval(medians)
    return {
        "status": "ok",
        "reason": None,
        "first_call_s": first_call,
        "steady_step_ms": steady.mean,
        "steady_step_ms_ci95": steady.half_width,
        "repeats": medians,
        **captured,
    }


def _export_error(model: nn.Module, x: torch.Tensor) -> str | None:
    """torch.export's error for `model`, its first lines (None if it exported)."""
    try:
        torch.export.export(model, (x,))
    except Exception as e:  # what it raises depends on the torch version: quote it
        lines = [line for line in str(e).splitlines() if line.strip()][:ERROR_LINES]
        return f"{type(e).__name__}: " + " ".join(lines)
    return None


def data_dependent(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """What each way of capturing does with a branch on a tensor's value."""
    torch.manual_seed(cfg["seed"])
    x = torch.randn(4, 16)
    branchy = Branchy()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(branchy)(x)
    torch._dynamo.reset()
    reasons = "; ".join(dict.fromkeys(str(r.reason) for r in explained.break_reasons))
    error = _export_error(branchy, x)
    cond = torch.export.export(BranchyCond(), (x,))
    return [
        {"model": "if h.sum() > 0", "capture": "eager", "outcome": "runs",
         "graphs": 0, "graph_breaks": 0, "ops": None,
         "detail": "Python evaluates the condition each step and takes one branch"},
        {"model": "if h.sum() > 0", "capture": "torch.compile", "outcome": "graph break",
         "graphs": explained.graph_count, "graph_breaks": explained.graph_break_count,
         "ops": explained.op_count,
         "detail": f"torch._dynamo.explain: {reasons} (the branch needs the tensor's value)"},
        {"model": "if h.sum() > 0", "capture": "torch.export",
         "outcome": "refused" if error else "exported", "graphs": 0 if error else 1,
         "graph_breaks": None, "ops": None, "detail": error or "exported"},
        {"model": "torch.cond(h.sum() > 0, ...)", "capture": "torch.export",
         "outcome": "exported", "graphs": 1, "graph_breaks": 0, "ops": _ops(cond.graph),
         "detail": "both branches are subgraphs of the one graph; the device picks one"},
    ]  # fmt: skip


def observations(rows: list[dict[str, Any]], control: list[dict[str, Any]]) -> list[str]:
    """Sentences computed from the rows: each mode against eager on its device."""
    notes = []
    for device in dict.fromkeys(r["device"] for r in rows):
        ok = {r["mode"]: r for r in rows if r["device"] == device and r["status"] == "ok"}
        eager = ok.get("eager")
        if eager is None:
            continue
        for mode in ("compile", "export"):
            row = ok.get(mode)
            if row is None:
                continue
            r = ratio(row["repeats"], eager["repeats"])
            said = verdict(r, "slower", "faster", "repeat")  # (times: > 1 is slower)
            interval = (
                f" (95% interval {r.low:.2f}–{r.high:.2f}×, {said})"
                if r.has_interval
                else f" (one repeat on a side: {said})"
            )
            notes.append(
                f"{device}, {mode}: first call {row['first_call_s']:.2f} s against eager's "
                f"{eager['first_call_s']:.3f} s ({row['first_call_s'] / eager['first_call_s']:.0f}×"
                f"), then a steady step of {row['steady_step_ms']:.2f} ms against "
                f"{eager['steady_step_ms']:.2f} ms, {r.value:.2f}× eager's{interval}; "
                f"captured {row['graphs']} graph(s), {row['graph_breaks']} break(s)."
            )
    broke = next(c for c in control if c["capture"] == "torch.compile")
    refused = next(c for c in control if c["capture"] == "torch.export" and "if" in c["model"])
    notes.append(
        f"A branch on a tensor's value: torch.compile split the model into {broke['graphs']} "
        f"graphs at {broke['graph_breaks']} graph break(s) and runs the branch in Python "
        f"between them; torch.export {refused['outcome']} it"
        + (f" ({refused['detail']})" if refused["outcome"] == "refused" else "")
        + "; written as torch.cond the same model exports as one graph."
    )
    return notes


def _figure(rows: list[dict[str, Any]]):
    """First call and steady step per mode, a bar per device; a device that did not run gets
    a label where its bars would be, never a bar."""
    fig = new_figure(9, 3.4)
    first_ax, step_ax = fig.subplots(1, 2)
    devices = list(dict.fromkeys(r["device"] for r in rows))
    width = 0.8 / len(devices)
    for i, device in enumerate(devices):
        for k, mode in enumerate(MODES):
            row = next(r for r in rows if r["device"] == device and r["mode"] == mode)
            x = k + i * width
            label = device if k == 0 else None
            if row["status"] != "ok":
                for ax in (first_ax, step_ax):
                    where = ax.get_xaxis_transform()  # x in data, y in axes fractions
                    ax.text(x, 0.02, f"{device}\n{row['status']}", ha="center", va="bottom",
                            fontsize=7, rotation=90, transform=where)  # fmt: skip
                continue
            color = f"C{i}"
            first_ax.bar(x, row["first_call_s"], width, color=color, label=label)
            half = row["steady_step_ms_ci95"]
            step_ax.bar(x, row["steady_step_ms"], width, color=color, label=label,
                        yerr=None if half is None else half, capsize=3)  # fmt: skip
    for ax, title, unit in ((first_ax, "First call (capture included)", "s"),
                            (step_ax, "Steady training step (95% interval)", "ms")):  # fmt: skip
        ax.set_xticks([k + width * (len(devices) - 1) / 2 for k in range(len(MODES))], MODES)
        ax.set(title=title, ylabel=unit, xlim=(-0.5, len(MODES) - 0.5 + width))
        ax.grid(axis="y", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    first_ax.set_yscale("log")
    step_ax.set_ylim(bottom=0)
    return fig


def warm_up(device: torch.device, cfg: dict[str, Any]) -> None:
    """One untimed eager step on `device`, so that what a process pays once (the device's
    context, the autograd engine's threads, the math libraries' first calls) is not charged
    to whichever mode comes first."""
    measure("eager", device, cfg | {"warmup_steps": 0, "steps": 1, "repeats": 1})


def run(cfg: dict[str, Any], out_dir: Path, *, threads: int, **_: Any) -> dict[str, Any]:
    torch.set_num_threads(threads)
    rows = []
    for device in cfg["devices"]:
        if device == "cpu" or torch.cuda.is_available():
            warm_up(torch.device(device), cfg)
        for mode in MODES:
            row: dict[str, Any] = {"device": device, "mode": mode}
            if device == "cuda" and not torch.cuda.is_available():
                row |= {"status": "skipped", "reason": "no CUDA device on this host"}
            else:
                log.info("measuring %s on %s", mode, device)
                row |= measure(mode, torch.device(device), cfg)
            rows.append(row)
    control = data_dependent(cfg)
    # (Each repeat's median stays in summary.json.)
    table = [{k: v for k, v in r.items() if k != "repeats"} for r in rows]
    write_csv(out_dir / "results.csv", table, RESULT_COLUMNS)
    write_csv(out_dir / "control_flow.csv", control, CONTROL_COLUMNS)
    save_figure(_figure(rows), out_dir / "graphs.png")
    return {"rows": rows, "control_flow": control, "notes": observations(rows, control)}
