"""The training micro-step, chosen once at setup: eager, compiled, or replayed as a CUDA graph.

Every step has the same call, `step(x, y, sync, divisor)`: forward, loss and backward of one
micro-batch, its loss divided by `divisor` (the micro-batches in its accumulation group), the
gradients all-reduced only when `sync` (the group's last micro-step), and the epoch's running
loss, correct predictions and sample count added to `step.sums` on the device (no host sync
inside the epoch). After each optimizer step the trainer calls `step.after_optimizer_step()`,
which clears the gradients the way that step needs.

- `EagerStep`: the course's code, one op at a time from Python.
- `CompiledStep`: the same, with the model compiled by `torch.compile` after the first step.
- `CapturedStep` (`step: graph`, and `step: compile` around a `CompiledStep`): at batch 32 a
  step of the course CNN is ~100 small kernels, and launching them from Python takes longer
  than running them, so the GPU idles between kernels. A CUDA graph records the step's kernels
  once and replays them with one launch. What is captured: forward, loss, backward (DDP's
  gradient all-reduce included) and the epoch's sums. The optimizer step stays outside the
  graph, where the learning-rate schedule can change its settings as usual; it is one fused
  kernel anyway.

The capture recipe is PyTorch's ("CUDA Graphs" in the CUDA semantics notes): warm up on a side
stream (the strategy says how many steps), capture with the gradients set to None so the
backward allocates them in the graph's memory pool, then never drop those gradient tensors
again: each replay overwrites them. The warm-up steps are real training steps, so capturing
changes nothing about what the run computes.

With gradient accumulation (k micro-batches per optimizer step) a micro-step must add to the
gradients instead of overwriting them, and under DDP only a group's last micro-step all-reduces
them (the others run under `no_sync`). So two graphs are captured, a no-sync and a sync
micro-step, both with the gradients allocated beforehand: the captured backward adds into those
very tensors, and the optimizer step zeroes them in place rather than dropping them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from dmls.config.spec import RunSpec
from dmls.training.parallel import SingleDevice
from dmls.training.precision import Autocast


def eager_reason(
    spec: RunSpec, strategy: SingleDevice, device: torch.device, fault_drill: bool
) -> str | None:
    """Why this run's step can't be captured as a CUDA graph, or None when it can."""
    if spec.step == "eager":
        return "step: eager"
    if device.type != "cuda":
        return "CUDA graphs need a GPU; this run trains on the CPU"
    blockers = strategy.capture_blockers()
    if fault_drill:
        blockers.append("a DMLS_FAULT drill changes the step from Python")
    return "; ".join(blockers) or None


def on_stream(stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager:
    """Run on `stream` (a captured step's side stream), or on the current one when None."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


class EagerStep:
    """Forward, loss and backward of one micro-batch, one op at a time."""

    def __init__(
        self,
        module: nn.Module,
        strategy: SingleDevice,
        optimizer: torch.optim.Optimizer,
        criterion: nn.Module,
        autocast: Autocast,
        device: torch.device,
        *,
        reason: str | None = None,
        drill: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.module = self.wrapped = module  # what runs the forward; the prepared model
        self.strategy, self.optimizer, self.criterion = strategy, optimizer, criterion
        self.autocast, self.drill = autocast, drill
        self.reason = reason  # why the run steps eagerly (recorded with its result)
        # Training loss, correct predictions and samples of the epoch so far.
        self.sums = torch.zeros(3, device=device, dtype=torch.float64)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, sync: bool, divisor: int) -> None:
        with self.strategy.no_sync(skip=not sync):
            with self.autocast():
                logits = self.module(x)
                loss = self.criterion(logits, y)
            if self.drill is not None:
                loss = self.drill(loss)
            self.strategy.backward(loss / divisor)
            self.sums[0] += loss.detach().double() * len(y)
            self.sums[1] += (logits.argmax(1) == y).sum()
            self.sums[2] += len(y)

    def after_optimizer_step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def compiled(self) -> bool:
        return self.module is not self.wrapped

    def record(self) -> dict[str, Any]:
        """How the steps ran, for the run's result."""
        return {"mode": "eager", "eager_reason": self.reason}

    def release(self) -> None:
        """Free what the step holds of the process group (nothing, eagerly)."""


class CompiledStep(EagerStep):
    """An eager step whose model is compiled after the first step (which runs eagerly, so the
    precision probe sees it). Only under a CUDA graph, which then replays the compiled kernels."""

    def __call__(self, x: torch.Tensor, y: torch.Tensor, sync: bool, divisor: int) -> None:
        super().__call__(x, y, sync, divisor)
        if not self.compiled:
            # Inductor fuses the step's elementwise work (BN, activation, pooling, their
            # backward) into a few kernels; the CUDA graph then replays those.
            # Static shapes (the ragged last batch gets its own graph, outside the capture) and
            # a fresh cache, so nothing compiled for an earlier run in this process recompiles
            # with dynamic shapes in the middle of a capture.
            # (Under DDP, dynamo splits the compiled graph at DDP's bucket boundaries, so the
            # all-reduces still start during the backward: tests/test_engine_cuda.py checks
            # that such a run learns what eager DDP learns.)
            torch._dynamo.reset()
            # A module compiles to a module (OptimizedModule); the stub says a callable.
            self.module = cast(nn.Module, torch.compile(self.wrapped, dynamic=False))


class CapturedStep:
    """Run `inner` eagerly while warming up, then capture it on `stream` and replay it for every
    later micro-batch of the captured shape (a full batch) and divisor (a full group).

    Warm-up counts sync micro-steps (optimizer steps: DDP's iterations): after `warmup_steps`
    of them, the next micro-step of each kind is captured. A micro-batch of another shape (the
    epoch's ragged last batch) runs eagerly, and so does the micro-step of a last group with
    fewer than `divisor` micro-batches. Without accumulation (`accumulate` False) a replay
    overwrites the gradients, so an eager step first zeroes what the last replay left; with
    accumulation the gradients are allocated before the first capture and every micro-step
    adds into them."""

    def __init__(
        self,
        inner: EagerStep,
        warmup_steps: int,
        stream: torch.cuda.Stream,
        batch_size: int,
        divisor: int = 1,
    ) -> None:
        self.inner, self.warmup_steps, self.stream = inner, warmup_steps, stream
        self.batch_size = batch_size  # the shape captured: a full batch, never the ragged one
        self.divisor = divisor  # the micro-batches of a full accumulation group
        self.accumulate = divisor > 1
        self.graphs: dict[bool, torch.cuda.CUDAGraph] = {}  # by `sync`
        self.warmup_syncs = 0
        self.eager_steps = 0
        self.replays = 0

    @property
    def sums(self) -> torch.Tensor:
        return self.inner.sums

    @property
    def compiled(self) -> bool:
        return self.inner.compiled

    def __call__(self, x: torch.Tensor, y: torch.Tensor, sync: bool, divisor: int) -> None:
        if divisor != self.divisor:  # a last group of fewer micro-batches: another divisor
            self.inner(x, y, sync, divisor)
            return
        graph = self.graphs.get(sync)
        if graph is not None and x.shape == self.x.shape:
            self.x.copy_(x, non_blocking=True)
            self.y.copy_(y, non_blocking=True)
            graph.replay()
            self.replays += 1
        elif graph is None and self.warmup_syncs >= self.warmup_steps and self._fits(x):
            self._capture(x, y, sync)
        else:
            if self.graphs and not self.accumulate:
                self.zero_grads()
            self.eager_steps += 1
            self.warmup_syncs += sync
            self.inner(x, y, sync, divisor)

    def _fits(self, x: torch.Tensor) -> bool:
        # Both graphs read their batch from the same static tensors: one shape for both.
        return len(x) == self.batch_size and (not self.graphs or x.shape == self.x.shape)

    def _capture(self, x: torch.Tensor, y: torch.Tensor, sync: bool) -> None:
        if not self.graphs:
            # Static inputs: every replay reads its batch from these tensors.
            self.x, self.y = x.clone(), y.clone()
            if self.accumulate:
                self.zero_grads()  # allocated outside the graph: both graphs add into them
        else:
            self.x.copy_(x, non_blocking=True)
            self.y.copy_(y, non_blocking=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            self.inner(self.x, self.y, sync, self.divisor)
        self.graphs[sync] = graph
        graph.replay()  # capturing recorded the step without running it
        self.replays += 1

    def zero_grads(self) -> None:
        """Zero every gradient in place, allocating the missing ones: a captured step keeps
        reading and writing these very tensors."""
        optimizer = self.inner.optimizer
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        optimizer.zero_grad(set_to_none=False)

    def after_optimizer_step(self) -> None:
        if not self.graphs:
            self.inner.after_optimizer_step()
        elif self.accumulate:
            self.zero_grads()  # the captured micro-steps add into these tensors
        # (Else a replayed step writes every gradient: nothing to zero.)

    def record(self) -> dict[str, Any]:
        summary = {
            "captured": self.replays > 0,  # a capture replays once at once
            "graphs": len(self.graphs),
            "eager_steps": self.eager_steps,
            "replayed_steps": self.replays,
        }
        if not summary["captured"]:
            reason = f"no epoch had more than {self.warmup_steps} full batches to warm up"
            return summary | {"mode": "eager", "eager_reason": reason}
        return summary | {"mode": "cuda_graph", "eager_reason": None}

    def release(self) -> None:
        """Free the graphs: they hold NCCL work of the group's communicator, and destroying the
        group while they lived hung both DDP ranks in destroy_process_group (2× H100, torch
        2.11)."""
        self.graphs.clear()
        torch.cuda.synchronize()


Step = EagerStep | CapturedStep


def build_step(
    spec: RunSpec,
    *,
    stream: torch.cuda.Stream | None,
    reason: str | None,
    drill: Callable[[torch.Tensor], torch.Tensor] | None,
    **parts: Any,
) -> Step:
    """The run's step: captured on `stream` when there is one (the run's `reason` to step
    eagerly is None), compiled first for `step: compile`; else eager. `parts` are what an
    `EagerStep` is made of (module, strategy, optimizer, criterion, autocast, device)."""
    if stream is None:
        return EagerStep(**parts, reason=reason, drill=drill)
    inner = (CompiledStep if spec.step == "compile" else EagerStep)(**parts)
    captured = CapturedStep(
        inner,
        inner.strategy.graph_warmup_steps,
        stream,
        batch_size=spec.batch_size,
        divisor=spec.grad_accum_steps,
    )
    torch.cuda.synchronize(inner.sums.device)  # the side stream starts after the setup copies
    return captured
