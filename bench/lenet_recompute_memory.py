"""Where D1's GPU peak with full recomputation comes from (dmls/special/lenet_memory/measure.py).

In the study, full recomputation on the GPU lowered the peak of every combination but the first
it measured (AdamW, fp32), whose peak rose instead. This measures, in one fresh process on a
GPU, the study's own `measure` for one combination several times in a row after the study's
warm-up (`cuda_library_workspaces`), and records the caching allocator's history of the first
measured window (torch.cuda.memory._record_memory_history): the allocations made inside it and
still alive when it closed (what a later window inherits instead of paying), with the stack
that made each, and the allocations alive at its peak, by the frame that made them.

    python3 bench/lenet_recompute_memory.py [--combo adamw fp32 full] [--times 3]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))
from dmls.config.spec import special_study_config
from dmls.special.lenet_memory.measure import cuda_library_workspaces, measure


def frame_of(frames: list[dict]) -> str:
    """The innermost frame worth naming: a C++ op (at::native, cudnn, cublas) or Python code."""
    for f in frames:
        name = f.get("name", "")
        if any(k in name for k in ("cudnn", "cublas", "at::native::", "at::cuda::")):
            return name.split("(")[0][:90]
    for f in frames:
        if f.get("filename", "").endswith(".py"):
            return f"{Path(f['filename']).name}:{f['line']} {f['name']}"
    return frames[0].get("name", "?")[:90] if frames else "?"


def replay(trace: list[dict]) -> tuple[int, dict[int, tuple[int, list]], dict[int, tuple]]:
    """The allocator's events in order: the most bytes alive at once, the blocks alive then, and
    the blocks still alive at the end."""
    live: dict[int, tuple[int, list]] = {}
    now = peak = 0
    at_peak: dict[int, tuple[int, list]] = {}
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            now += e["size"]
            if now > peak:
                peak, at_peak = now, dict(live)
        elif e["action"] == "free_completed" and e["addr"] in live:
            now -= live.pop(e["addr"])[0]
    return peak, at_peak, live


def by_frame(blocks: dict[int, tuple[int, list]]) -> list[tuple[str, int, int]]:
    sizes: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for size, frames in blocks.values():
        sizes[frame_of(frames)] += size
        counts[frame_of(frames)] += 1
    return [(k, sizes[k], counts[k]) for k, _ in sizes.most_common()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--combo",
        nargs=3,
        default=["adamw", "fp32", "full"],
        metavar=("OPTIMIZER", "PRECISION", "RECOMPUTE"),
    )
    ap.add_argument("--times", type=int, default=3)
    args = ap.parse_args()
    cfg = special_study_config("lenet_memory")  # (the default DAG's settings)
    cuda = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; combo {args.combo}")
    print(f"after the study's warm-up: {cuda_library_workspaces(cfg):,} bytes held")
    torch.cuda.memory._record_memory_history(context="all", stacks="all")
    for i in range(args.times):
        before = torch.cuda.memory_allocated(cuda)
        row = measure(cuda, *args.combo, cfg)
        after = torch.cuda.memory_allocated(cuda)
        print(f"window {i}: peak {row['peak_bytes']:,} bytes; held after it {after - before:+,}")
        if i == 0:
            trace = torch.cuda.memory._snapshot()["device_traces"][cuda.index or 0]
            torch.cuda.memory._record_memory_history(enabled=None)
    peak, at_peak, left = replay(trace)
    print(f"window 0 replayed: {peak:,} bytes alive at its peak (above the window's start)")
    print("alive at the peak, by the frame that allocated them:")
    for name, size, n in by_frame(at_peak):
        print(f"  {size:>10,} bytes in {n:>3} block(s)  {name}")
    print("allocated in window 0 and still alive after it:")
    for name, size, n in by_frame(left):
        print(f"  {size:>10,} bytes in {n:>3} block(s)  {name}")


if __name__ == "__main__":
    main()
