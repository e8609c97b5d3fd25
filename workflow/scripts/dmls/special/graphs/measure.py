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

Per device, after one untimed eager step: each mode's first call (capture and compiling
included) and what it captured (graphs, graph breaks, ops); then the steady training step
(forward, loss, backward, SGD step; median of `steps` after `warmup_steps`), the modes taking
turns: each of `repeats` repeats times every mode once, in an order drawn afresh (seeded), and
keeps each mode's start and place, so that what drifts over the study (eager's repeats once
drifted 21.27 -> 24.78 ms while measured in a block of their own) falls on every mode alike, and
a mode is compared with eager repeat by repeat. Then a model whose branch depends on a tensor's
value: what `torch._dynamo.explain` says of it, the error `torch.export` gives, and the same
model with the branch written as `torch.cond`, which exports.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any, cast

import torch
import torch._dynamo  # here, not inside a timed first call: its import takes seconds
from torch import nn

from dmls.files import new_figure, save_figure, write_csv
from dmls.stats import mean_interval, turns
from dmls.training import models

log = logging.getLogger(__name__)

MODES = ("eager", "compile", "export")
INPUT_SHAPE, NUM_CLASSES = (3, 32, 32), 10
RESULT_COLUMNS = (
    "device", "mode", "status", "reason", "first_call_s", "steady_step_ms", "steady_step_ms_ci95",
    "graphs", "graph_breaks", "ops", "captured",
)  # fmt: skip
# Each repeat's median, start and place in its order stay in summary.json.
PER_REPEAT = ("repeats", "repeat_started_s", "repeat_position")
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


def prepare(mode: str, model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, dict[str, Any]]:
    """What runs the forward in `mode`, and what was captured (the capture itself is timed
    with the first call)."""
    if mode == "eager":
        return model, {
            "graphs": 0,
            "graph_breaks": 0,
            "ops": None,
            "captured": "nothing: each op runs as Python reaches it",
        }
    if mode == "compile":
        torch._dynamo.reset()  # nothing compiled before counts
        explained = torch._dynamo.explain(model)(x)
        torch._dynamo.reset()
        # A module compiles to a module (OptimizedModule); the stub says a callable.
        return cast(nn.Module, torch.compile(model)), {
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


class Mode:
    """One way of running the course CNN's training step on a device, built and called once
    (`first_call_s`, `captured`); `time_steps` then times its steady steps."""

    def __init__(self, mode: str, device: torch.device, cfg: dict[str, Any]) -> None:
        torch.manual_seed(cfg["seed"])
        self.device, self.cfg = device, cfg
        model = course_cnn(cfg).to(device)
        self.x = torch.randn(cfg["batch_size"], *INPUT_SHAPE, device=device)
        self.y = torch.randint(0, NUM_CLASSES, (cfg["batch_size"],), device=device)
        start = time.perf_counter()
        self.forward, self.captured = prepare(mode, model, self.x)
        capture = time.perf_counter() - start
        # The parameters the step updates (export's module holds its own, lifted, copies);
        # built outside the timed calls, as a training loop builds it once.
        self.optimizer = torch.optim.SGD(self.forward.parameters(), lr=cfg["lr"])
        self.sync()
        start = time.perf_counter()
        self.step()
        self.sync()
        self.first_call_s = capture + time.perf_counter() - start

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(self.forward(self.x), self.y).backward()
        self.optimizer.step()

    def time_steps(self, steps: int) -> float:
        """The median of `steps` steps, in ms."""
        times = []
        for _ in range(steps):
            self.sync()
            t0 = time.perf_counter()
            self.step()
            self.sync()
            times.append(time.perf_counter() - t0)
        return 1000 * statistics.median(times)


def measure_device(modes: list[str], device: torch.device, cfg: dict[str, Any]) -> list[dict]:
    """Every mode of `modes` on `device`: built and first called in turn, warmed up, then timed
    taking turns (`stats.turns`); a row per mode with each repeat's median, start (seconds
    from the first repeat's) and place in its repeat's order."""
    built = {mode: Mode(mode, device, cfg) for mode in modes}
    for each in built.values():
        for _ in range(cfg["warmup_steps"]):
            each.step()
    timed: dict[str, list[tuple[float, float, int]]] = {mode: [] for mode in modes}
    start = time.perf_counter()
    for order in turns(modes, cfg["repeats"], cfg["seed"]):
        for position, mode in enumerate(order):
            begun = time.perf_counter() - start
            timed[mode].append((built[mode].time_steps(cfg["steps"]), round(begun, 4), position))
    rows = []
    for mode, repeats in timed.items():
        steady = mean_interval([ms for ms, _, _ in repeats])
        assert steady is not None  # repeats ≥ 1 (the schema), each a finite median
        rows.append(
            {
                "status": "ok",
                "reason": None,
                "mode": mode,
                "first_call_s": built[mode].first_call_s,
                "steady_step_ms": steady.mean,
                "steady_step_ms_ci95": steady.half_width,
                "repeats": [ms for ms, _, _ in repeats],
                "repeat_started_s": [t for _, t, _ in repeats],
                "repeat_position": [p for _, _, p in repeats],
                **built[mode].captured,
            }
        )
    return rows


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
        {
            "model": "if h.sum() > 0",
            "capture": "eager",
            "outcome": "runs",
            "graphs": 0,
            "graph_breaks": 0,
            "ops": None,
            "detail": "Python evaluates the condition each step and takes one branch",
        },
        {
            "model": "if h.sum() > 0",
            "capture": "torch.compile",
            "outcome": "graph break",
            "graphs": explained.graph_count,
            "graph_breaks": explained.graph_break_count,
            "ops": explained.op_count,
            "detail": f"torch._dynamo.explain: {reasons} (the branch needs the tensor's value)",
        },
        {
            "model": "if h.sum() > 0",
            "capture": "torch.export",
            "outcome": "refused" if error else "exported",
            "graphs": 0 if error else 1,
            "graph_breaks": None,
            "ops": None,
            "detail": error or "exported",
        },
        {
            "model": "torch.cond(h.sum() > 0, ...)",
            "capture": "torch.export",
            "outcome": "exported",
            "graphs": 1,
            "graph_breaks": 0,
            "ops": _ops(cond.graph),
            "detail": "both branches are subgraphs of the one graph; the device picks one",
        },
    ]


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
                    ax.text(
                        x,
                        0.02,
                        f"{device}\n{row['status']}",
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        rotation=90,
                        transform=where,
                    )
                continue
            color = f"C{i}"
            first_ax.bar(x, row["first_call_s"], width, color=color, label=label)
            half = row["steady_step_ms_ci95"]
            step_ax.bar(
                x,
                row["steady_step_ms"],
                width,
                color=color,
                label=label,
                yerr=None if half is None else half,
                capsize=3,
            )
    for ax, title, unit in (
        (first_ax, "First call (capture included)", "s"),
        (step_ax, "Steady training step (95% interval)", "ms"),
    ):
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
    Mode("eager", device, cfg)


def run(cfg: dict[str, Any], out_dir: Path, *, threads: int, **_: Any) -> dict[str, Any]:
    torch.set_num_threads(threads)
    rows = []
    for device in cfg["devices"]:
        if device == "cuda" and not torch.cuda.is_available():
            rows += [
                {
                    "device": device,
                    "mode": mode,
                    "status": "skipped",
                    "reason": "no CUDA device on this host",
                }
                for mode in MODES
            ]
            continue
        warm_up(torch.device(device), cfg)
        log.info("measuring %s on %s, taking turns", ", ".join(MODES), device)
        rows += [
            {"device": device} | row
            for row in measure_device(list(MODES), torch.device(device), cfg)
        ]
    control = data_dependent(cfg)
    table = [{k: v for k, v in r.items() if k not in PER_REPEAT} for r in rows]
    write_csv(out_dir / "results.csv", table, RESULT_COLUMNS)
    write_csv(out_dir / "control_flow.csv", control, CONTROL_COLUMNS)
    save_figure(_figure(rows), out_dir / "graphs.png")
    return {"rows": rows, "control_flow": control}
