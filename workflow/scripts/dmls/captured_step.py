"""The training step replayed as one CUDA graph (`step: graph` and `step: compile`).

At batch 32 a step of the course CNN is ~100 small kernels: launching them from Python takes
longer than running them, so the GPU idles between kernels. A CUDA graph records the step's
kernels once and replays them with one launch. What is captured: forward, loss, backward
(DDP's gradient all-reduce included) and the epoch's running loss and accuracy sums. The
optimizer step stays outside the graph, where the learning-rate schedule can change its
settings as usual; it is one fused kernel anyway.

The recipe is PyTorch's ("CUDA Graphs" in the CUDA semantics notes): warm up on a side stream
(11 steps under DDP, whose first iterations log and rebuild buckets), capture with the gradients
set to None so the backward allocates them in the graph's memory pool, then never drop those
gradient tensors again: each replay overwrites them. The warm-up steps are real training
steps, so capturing changes nothing about what the run computes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .spec import RunSpec

MicroStep = Callable[[torch.Tensor, torch.Tensor], None]


def eager_reason(spec: RunSpec, device: torch.device, fault_drill: bool) -> str | None:
    """Why this run's step can't be captured as a CUDA graph, or None when it can."""
    if spec.step == "eager":
        return "step: eager"
    if device.type != "cuda":
        return "CUDA graphs need a GPU; this run trains on the CPU"
    blockers = [
        (spec.launcher == "dp",
         "DataParallel copies the model to its GPUs from Python in every step"),
        (spec.launcher == "accelerate",
         "accelerate prepares the model, optimizer and scaler its own way"),
        (spec.backend == "gloo" and spec.replicas > 1 and spec.launcher != "dp",
         "gloo all-reduces CUDA tensors through host memory, which a CUDA graph can't capture"),
        (spec.grad_accum_steps > 1,
         "gradient accumulation alternates no-sync and sync micro-steps"),
        (spec.precision == "fp8", "torchao's fp8 layers rescale dynamically from Python"),
        (fault_drill, "a DMLS_FAULT drill changes the step from Python"),
    ]  # fmt: skip
    found = [reason for blocked, reason in blockers if blocked]
    return "; ".join(found) or None


class CapturedStep:
    """Run `micro_step(x, y)` (forward, loss, backward, metric sums) eagerly for `warmup_steps`
    batches, then capture it on `stream` and replay it for every later batch of the captured
    shape. A batch of another shape (the epoch's ragged last batch) runs eagerly, after
    `zero_grads` clears the gradients the last replay left (a replay overwrites them)."""

    def __init__(
        self,
        micro_step: MicroStep,
        zero_grads: Callable[[], None],
        warmup_steps: int,
        stream: torch.cuda.Stream,
    ) -> None:
        self.micro_step, self.zero_grads = micro_step, zero_grads
        self.warmup_steps, self.stream = warmup_steps, stream
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager_steps = 0
        self.replays = 0

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.graph is not None and x.shape == self.x.shape:
            self.x.copy_(x, non_blocking=True)
            self.y.copy_(y, non_blocking=True)
            self.graph.replay()
            self.replays += 1
        elif self.graph is None and self.eager_steps >= self.warmup_steps:
            self._capture(x, y)
        else:
            if self.graph is not None:
                self.zero_grads()
            self.eager_steps += 1
            self.micro_step(x, y)

    def _capture(self, x: torch.Tensor, y: torch.Tensor) -> None:
        # Static inputs: every replay reads its batch from these tensors.
        self.x, self.y = x.clone(), y.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            self.micro_step(self.x, self.y)
        self.graph = graph
        graph.replay()  # capturing recorded the step without running it
        self.replays += 1

    def release(self) -> None:
        """Free the graph (before the process group goes: see engine.train)."""
        self.graph = None
        torch.cuda.synchronize()

    @property
    def summary(self) -> dict[str, int | bool]:
        return {
            "captured": self.replays > 0,  # a capture replays once at once
            "eager_steps": self.eager_steps,
            "replayed_steps": self.replays,
        }
