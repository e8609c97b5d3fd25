"""Where a D4 step goes on 2 GPUs: DDP against FSDP2 (ZeRO-2, ZeRO-3), from a profiler trace.

D4 (special study `sharding`) measured the sharded steps slower than DDP's by more than the
collectives sweep predicts for their communication. This runs D4's setup (the same wide MLP,
batch, fused AdamW and eager steps, through the engine's strategies) for each strategy under
torch.profiler on rank 0 and sums the GPU kernels per step by kind:
  - compute: GEMMs and the elementwise kernels of forward and backward;
  - nccl: the collectives' kernels (they run on their own streams, overlapping compute or not);
  - copies: FSDP2's copy-in to and copy-out of its all-gather and reduce-scatter buffers;
  - optimizer: the fused AdamW kernels;
and the step's wall time, the time the GPU ran no compute kernel (union of compute intervals
subtracted from the step), and how much of the NCCL time overlapped compute.

    torchrun --nproc_per_node 2 bench/sharding_profile.py --strategy gradients \
        --out sharding_profile_gradients.json                           (2 CUDA GPUs)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from dmls.data import datasets
from dmls.special.sharding.measure import run_spec
from dmls.training.parallel import strategy_for
from dmls.training.trainer import Trainer

KINDS = {
    "nccl": ("nccl",),
    "copies": ("chunk_cat", "split_with_sizes", "foreach_copy", "copy_kernel", "Memcpy", "Memset"),
    "optimizer": ("adam",),
}


def kind(name: str) -> str:
    lower = name.lower()
    for k, keys in KINDS.items():
        if any(key.lower() in lower for key in keys):
            return k
    return "compute"


def union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -1.0
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def warm_trainer(sharding: str, steps: int, data: Path, device: str = "cuda"):
    """D4's setup on this torchrun rank as the study builds it (the wide MLP, batch 32 per
    rank, fused AdamW, eager steps), after one warm-up epoch: (strategy, trainer, `steps`
    batches on the device). Also bench/sharding_memory.py's. `device` cpu: a small MLP on
    Gloo, to try a script without GPUs."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == 0 and not (data / "synthetic_cifar.json").exists():
        datasets.prepare("synthetic_cifar", {"n_train": 2048, "n_test": 256, "seed": 0}, data)
    cfg = {"dataset": "synthetic_cifar", "repeats": 1, "steps": max(steps, 10), "batch_size": 32,
           "model": {"cuda": {"hidden": 8192, "layers": 8},
                     "cpu": {"hidden": 64, "layers": 2}}}  # fmt: skip
    spec = run_spec(cfg, device, sharding, world)
    strategy = strategy_for(spec)
    process = strategy.join()
    torch.distributed.barrier()  # the data is prepared
    trainer = Trainer(spec, strategy, process, data, fused_optimizer=device == "cuda")
    trainer.train_epoch(0)  # warm-up
    return strategy, trainer, [trainer.to_device(x, y) for x, y in trainer.data.train][:steps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="gradients")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--data", type=Path, default=Path("/tmp/dmls-sharding-profile"))
    parser.add_argument("--out", type=Path, default=Path("sharding_profile.json"))
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    strategy, trainer, batches = warm_trainer(args.strategy, args.steps, args.data)
    device = trainer.process.device

    def step(x, y) -> None:
        trainer.step(x, y, sync=True, divisor=1)
        trainer.optimizer_step()

    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for x, y in batches:
        step(x, y)
    torch.cuda.synchronize(device)
    wall_ms = 1000 * (time.perf_counter() - start) / len(batches)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for x, y in batches:
            step(x, y)
        torch.cuda.synchronize(device)
    # Kernels only: not the ranges the profiler annotates on the GPU's timeline (`nccl:*`,
    # `Optimizer.step#...`), which span their kernels and the gaps between them.
    kernels = [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and not e.name.startswith("nccl:")
        and "#" not in e.name
    ]
    n = len(batches)
    by_kind: dict[str, float] = {}
    spans: dict[str, list[tuple[float, float]]] = {}
    for e in kernels:
        k = kind(e.name)
        by_kind[k] = by_kind.get(k, 0.0) + e.device_time / 1000 / n
        spans.setdefault(k, []).append((e.time_range.start, e.time_range.end))
    per_name: dict[str, float] = {}
    for e in kernels:
        per_name[e.name] = per_name.get(e.name, 0.0) + e.device_time / 1000 / n
    first = min(e.time_range.start for e in kernels)
    last = max(e.time_range.end for e in kernels)
    busy = union(spans.get("compute", []) + spans.get("optimizer", []) + spans.get("copies", []))
    nccl = union(spans.get("nccl", []))
    exposed = (
        union(
            spans.get("nccl", [])
            + spans.get("compute", [])
            + spans.get("optimizer", [])
            + spans.get("copies", [])
        )
        - busy
    )
    result = {
        "strategy": args.strategy,
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "wall_ms_per_step": wall_ms,
        "profiled_span_ms_per_step": (last - first) / 1000 / n,
        "kernel_ms_per_step": by_kind,
        "gpu_busy_ms_per_step": busy / 1000 / n,
        "nccl_ms_per_step": nccl / 1000 / n,
        "nccl_exposed_ms_per_step": exposed / 1000 / n,
        "top_kernels": sorted(per_name.items(), key=lambda kv: -kv[1])[:12],
    }
    if rank == 0:
        args.out.write_text(json.dumps(result, indent=1))
        print(json.dumps({k: v for k, v in result.items() if k != "top_kernels"}), flush=True)
    trainer.release()
    strategy.end_seed()
    strategy.close()


if __name__ == "__main__":
    main()
