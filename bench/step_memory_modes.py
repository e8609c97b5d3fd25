"""What a training step adds to GPU memory (training/results.StepMemory) by precision and step
mode, one GPU, the course CNN at batch 32 on synthetic CIFAR-sized data, one epoch each: where
a precision's step memory differs, whether the step mode (eager, CUDA graph, compiled) is why.
With --snapshot MODE, the allocations alive at the first epoch's peak of that precision/mode
pair, by the frame that made them (torch.cuda.memory._record_memory_history).

    python3 bench/step_memory_modes.py [--snapshot bf16/eager]
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from epoch_speed import ROOT, a1_spec

sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from dmls.data import datasets
from dmls.training.parallel import strategy_for
from dmls.training.trainer import Trainer

MIB = 2**20


def measure(data: Path, precision: str, step: str, snapshot: bool) -> dict[int, tuple[int, int]]:
    spec = a1_spec("single_gpu", dataset="synthetic_cifar", epochs=1, precision=precision,
                   step=step, num_workers=0)  # fmt: skip
    strategy = strategy_for(spec)
    process = strategy.join()
    trainer = Trainer(spec, strategy, process, data)
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    trainer.train_epoch(0)
    trainer.synchronize()
    if snapshot:
        alive_at_peak(torch.cuda.memory._snapshot())
        torch.cuda.memory._record_memory_history(enabled=None)
    record = trainer.memory.record()
    strategy.close()
    return record


def alive_at_peak(snapshot: dict) -> None:
    """Replay the allocator's trace; at the peak, sum what is alive by its deepest frame in
    our package or torch's Python code."""
    alive: dict[int, tuple[int, str]] = {}
    total, peak, at_peak = 0, 0, {}
    for event in snapshot["device_traces"][0]:
        if event["action"] == "alloc":
            frames = event.get("frames") or []
            where = next((f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}"
                          for f in frames if "dmls" in f["filename"]), "?")  # fmt: skip
            alive[event["addr"]] = (event["size"], where)
            total += event["size"]
            if total > peak:
                peak, at_peak = total, dict(alive)
        elif event["action"] == "free_completed" and event["addr"] in alive:
            total -= alive.pop(event["addr"])[0]
    by_site = collections.Counter()
    for size, where in at_peak.values():
        by_site[where] += size
    print(f"  traced peak {peak / MIB:.1f} MiB above the trace's start; alive at the peak:")
    for where, size in by_site.most_common(8):
        print(f"    {size / MIB:8.1f} MiB  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--snapshot", default="")
    parser.add_argument("--one", help="measure only this precision/step (in this process)")
    parser.add_argument("--data", type=Path, help="(with --one) the prepared data")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("a step's GPU memory needs a CUDA GPU; there is none here")
    if args.one:
        precision, step = args.one.split("/")
        ((before, rise),) = measure(args.data, precision, step, args.one == args.snapshot).values()
        print(f"{args.one:14} held as the step began {before / MIB:7.1f} MiB, the step adds "
              f"{rise / MIB:7.1f} MiB", flush=True)  # fmt: skip
        return
    with tempfile.TemporaryDirectory(prefix="dmls-mem-") as tmp:
        data = Path(tmp)
        datasets.prepare("synthetic_cifar", {"n_train": 10000, "n_test": 2000, "seed": 0}, data)
        for step in ("eager", "graph", "compile"):
            for precision in ("fp32", "bf16", "fp16"):
                # Each in a process of its own: nothing an earlier one left counts.
                one = ["--one", f"{precision}/{step}", "--data", str(data)]
                subprocess.run([sys.executable, __file__, *one, "--snapshot", args.snapshot],
                               check=True)  # fmt: skip


if __name__ == "__main__":
    main()
