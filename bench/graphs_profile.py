"""Why D5's compiled step can be slower than the eager one on a GPU: where a step's time goes.

D5 (special study `graphs`) times the course CNN's training step (batch 32) eager, under
torch.compile and torch.export-ed. On an H100 the compiled step came out slower than the eager
one. This script runs the same step (dmls.special.graphs: same model, batch, SGD) per mode under
torch.profiler and splits a step into:
  - wall time per step (synchronised, outside the profiler);
  - GPU time per step: the sum of the CUDA kernels' durations (what the device computes);
  - kernels launched per step, and host (CPU) time per step of the step's Python and dispatch;
and adds torch.compile(mode="reduce-overhead"), which replays the compiled kernels from a
CUDA graph: if the compiled step's kernels take less GPU time than eager's but its wall time is
longer, the host is the bottleneck (a step of ~100 small kernels is launch-bound), and a CUDA
graph removes it.

    python bench/graphs_profile.py --out graphs_profile.json     (needs a CUDA GPU)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from dmls.special.graphs.measure import INPUT_SHAPE, NUM_CLASSES, course_cnn, prepare

CFG = {"conv_channels": [32, 64, 128], "fc_hidden": 256, "seed": 0}
MODES = ("eager", "compile", "compile_reduce_overhead", "export")


def build(mode: str, batch: int, device: torch.device):
    torch.manual_seed(0)
    model = course_cnn(CFG).to(device)
    x = torch.randn(batch, *INPUT_SHAPE, device=device)
    y = torch.randint(0, NUM_CLASSES, (batch,), device=device)
    if mode == "compile_reduce_overhead":
        torch._dynamo.reset()
        forward = torch.compile(model, mode="reduce-overhead")
    else:
        forward, _ = prepare(mode, model, x)
    optimizer = torch.optim.SGD(forward.parameters(), lr=0.01)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(forward(x), y).backward()
        optimizer.step()

    return step


def measure(mode: str, batch: int, steps: int, device: torch.device) -> dict:
    step = build(mode, batch, device)
    for _ in range(20):  # compile, autotune, capture
        step()
    torch.cuda.synchronize(device)
    walls = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
        walls.append(1000 * (time.perf_counter() - start) / steps)
    # The profiled steps: host time of the whole step, kernels and their device time.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        host_ms = 1000 * (time.perf_counter() - start) / steps  # the host's enqueueing time
        torch.cuda.synchronize(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_ms = sum(e.device_time for e in kernels) / 1000 / steps
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time / 1000 / steps
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:8]
    return {
        "mode": mode,
        "wall_ms_per_step": statistics.median(walls),
        "wall_ms_repeats": walls,
        "gpu_kernel_ms_per_step": gpu_ms,
        "kernels_per_step": len(kernels) / steps,
        "host_ms_per_step_profiled": host_ms,
        "gpu_busy_fraction": gpu_ms / statistics.median(walls),
        "top_kernels_ms": top,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("graphs_profile.json"))
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    rows = []
    for mode in MODES:
        row = measure(mode, args.batch, args.steps, device)
        rows.append(row)
        print(
            f"{mode:24s} wall {row['wall_ms_per_step']:.3f} ms/step, GPU kernels "
            f"{row['gpu_kernel_ms_per_step']:.3f} ms ({row['kernels_per_step']:.0f} kernels, "
            f"busy {100 * row['gpu_busy_fraction']:.0f}%), host enqueue "
            f"{row['host_ms_per_step_profiled']:.3f} ms (profiled)",
            flush=True,
        )
    facts = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "batch": args.batch,
        "steps": args.steps,
        "rows": rows,
    }
    args.out.write_text(json.dumps(facts, indent=1))


if __name__ == "__main__":
    main()
