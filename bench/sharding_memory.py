"""What is allocated at a D4 step's peak, beyond the sharded state: the caching allocator's
history (torch.cuda.memory._record_memory_history) of rank 0 over a few steps, replayed to the
moment of the highest allocated total, and the blocks then alive that the steps allocated,
grouped by size and the Python frames that allocated them.

D4 (special study `sharding`) predicts each strategy's peak from the state and a few layers'
buffers (dmls/special/sharding/measure.py's docstring). This shows where a measured peak exceeds it.

    torchrun --nproc_per_node 4 bench/sharding_memory.py --strategy full \
        --out sharding_memory_full.json                                 (N CUDA GPUs)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from sharding_profile import warm_trainer  # (bench/ is the script's folder: on sys.path)

MIB = 2**20


def where(frames: list[dict]) -> str:
    """The innermost frames of torch's distributed and nn code and the outermost of ours."""
    names = [f"{Path(f['filename']).name}:{f['name']}" for f in frames if f["filename"] != "??"]
    torch_side = [n for n in names if not n.startswith(("trainer.py", "steps.py", "sharding"))]
    return " < ".join(torch_side[:4])


def peak_blocks(trace: list[dict], base: int) -> tuple[int, list[dict]]:
    """Replay allocations and frees from `base` allocated bytes: the highest total and the
    blocks the trace allocated that were alive then."""
    live: dict[int, dict] = {}
    total, peak, at_peak = base, base, []
    for event in trace:
        action = event["action"]
        if action == "alloc":
            live[event["addr"]] = event
            total += event["size"]
            if total > peak:
                peak, at_peak = total, list(live.values())
        elif action == "free_completed":
            live.pop(event["addr"], None)
            total -= event["size"]
    return peak, at_peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="full")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("/tmp/dmls-sharding-profile"))
    parser.add_argument("--out", type=Path, default=Path("sharding_memory.json"))
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    strategy, trainer, batches = warm_trainer(args.strategy, args.steps, args.data)
    device = trainer.process.device
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    for x, y in batches:
        trainer.step(x, y, sync=True, divisor=1)
        trainer.optimizer_step()
    torch.cuda.synchronize(device)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    index = device.index if device.index is not None else torch.cuda.current_device()
    peak, blocks = peak_blocks(snapshot["device_traces"][index], base)
    groups = Counter((b["size"], where(b.get("frames", []))) for b in blocks)
    result = {
        "strategy": args.strategy,
        "processes": world,
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "allocated_before_steps_mib": base / MIB,
        "peak_replayed_mib": peak / MIB,
        "peak_allocator_mib": torch.cuda.max_memory_allocated(device) / MIB,
        "alive_at_peak": [
            {"mib": size / MIB, "count": n, "total_mib": size * n / MIB, "allocated_by": frames}
            for (size, frames), n in sorted(groups.items(), key=lambda kv: -kv[0][0] * kv[1])
        ][:15],
    }
    if rank == 0:
        args.out.write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1), flush=True)
    trainer.release()
    strategy.end_seed()
    strategy.close()


if __name__ == "__main__":
    main()
