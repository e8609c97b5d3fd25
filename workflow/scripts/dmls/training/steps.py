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

With gradient accumulation (k micro-batches per optimizer step) a micro-step must add to the
gradients instead of overwriting them, and under DDP only a group's last micro-step all-reduces
them (the others run under `no_sync`). So two graphs are captured, a no-sync and a sync
micro-step, both with the gradients allocated beforehand: the captured backward adds into those
very tensors, and the optimizer step zeroes them in place rather than dropping them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dmls.config.spec import RunSpec

# (x, y, sync): forward, loss, backward and metric sums of one micro-batch; `sync` False is a
# micro-step under DDP's no_sync (gradient accumulation), whose gradients are not all-reduced.
MicroStep = Callable[[torch.Tensor, torch.Tensor, bool], None]


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
        (spec.precision == "fp8", "torchao's fp8 layers rescale dynamically from Python"),
        (fault_drill, "a DMLS_FAULT drill changes the step from Python"),
    ]  # fmt: skip
    found = [reason for blocked, reason in blockers if blocked]
    return "; ".join(found) or None


class CapturedStep:
    """Run `micro_step(x, y, sync)` eagerly while warming up, then capture it on `stream` and
    replay it for every later micro-batch of the captured shape (a full batch).

    Warm-up counts sync micro-steps (optimizer steps: DDP's iterations): after `warmup_steps`
    of them, the next micro-step of each kind is captured. A micro-batch of another shape (the
    epoch's ragged last batch) runs eagerly. Without accumulation (`accumulate` False) a replay
    overwrites the gradients, so an eager step first calls `zero_grads` to clear what the last
    replay left; with accumulation `zero_grads` allocates them before the first capture and
    every micro-step adds into them."""

    def __init__(
        self,
        micro_step: MicroStep,
        zero_grads: Callable[[], None],
        warmup_steps: int,
        stream: torch.cuda.Stream,
        batch_size: int,
        accumulate: bool = False,
    ) -> None:
        self.micro_step, self.zero_grads = micro_step, zero_grads
        self.warmup_steps, self.stream, self.accumulate = warmup_steps, stream, accumulate
        self.batch_size = batch_size  # the shape captured: a full batch, never the ragged one
        self.graphs: dict[bool, torch.cuda.CUDAGraph] = {}  # by `sync`
        self.warmup_syncs = 0
        self.eager_steps = 0
        self.replays = 0

    def __call__(self, x: torch.Tensor, y: torch.Tensor, sync: bool = True) -> None:
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
            self.micro_step(x, y, sync)

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
            self.micro_step(self.x, self.y, sync)
        self.graphs[sync] = graph
        graph.replay()  # capturing recorded the step without running it
        self.replays += 1

    def release(self) -> None:
        """Free the graphs (before the process group goes: see engine.train)."""
        self.graphs.clear()
        torch.cuda.synchronize()

    @property
    def summary(self) -> dict[str, int | bool]:
        return {
            "captured": self.replays > 0,  # a capture replays once at once
            "graphs": len(self.graphs),
            "eager_steps": self.eager_steps,
            "replayed_steps": self.replays,
        }
