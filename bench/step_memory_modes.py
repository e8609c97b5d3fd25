"""What training adds to GPU memory (training/results.StepMemory: the steady steps' peak above
what was held before training) by precision, step mode and batch, one GPU, the course CNN on
synthetic CIFAR-sized data, one epoch each: where a precision's or a batch's memory differs,
whether the step mode (eager, CUDA graph, compiled) is why. With --snapshot P/S/B, the
allocations that the first and the twentieth step of that precision/step/batch made and held at
their peak, by the frame that made them (torch.cuda.memory._record_memory_history).

    python3 bench/step_memory_modes.py [--batches 32] [--steps eager,graph,compile]
        [--precisions fp32,bf16,fp16] [--snapshot bf16/eager/32]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
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


def measure(
    data: Path, precision: str, step: str, batch: int, snapshot: bool
) -> dict[int, tuple[int, int]]:
    spec = a1_spec(
        "single_gpu",
        dataset="synthetic_cifar",
        epochs=1,
        precision=precision,
        step=step,
        num_workers=0,
        batch_size=batch,
        validation_samples=0,
    )
    strategy = strategy_for(spec)
    process = strategy.join()
    trainer = Trainer(spec, strategy, process, data)
    if snapshot:
        trace_steps(trainer, SNAPSHOT_STEPS)
    reserved = torch.cuda.memory_reserved()
    trainer.train_epoch(0)
    trainer.synchronize()
    # The caching allocator's reserve over the steady steps (StepMemory reset the peaks as each
    # began): a CUDA graph's pool is reserved for its replays, and not counted as allocated.
    print(
        f"  reserved: steady peak {(torch.cuda.max_memory_reserved() - reserved) / MIB:.1f} "
        "MiB above what was reserved before training",
        flush=True,
    )
    record = trainer.memory.record()
    strategy.close()
    return record


# The steps traced with --snapshot: the first (the optimizer's state and the libraries' first
# workspaces are made in it), and one past the warm-up steps and a CUDA graph's capture.
SNAPSHOT_STEPS = (1, 20)


def trace_steps(trainer: Trainer, traced: tuple[int, ...]) -> None:
    """Record the allocator's history during the trainer's `traced` steps only (StepMemory.step
    wraps every step), and print what each allocated and was alive at its peak."""
    steps = {"n": 0}
    wrapped = trainer.memory.step

    @contextlib.contextmanager
    def step():
        steps["n"] += 1
        k = steps["n"]
        if k not in traced:
            with wrapped():
                yield
            return
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=200_000)
        with wrapped():
            yield
        torch.cuda.synchronize()
        print(f"  step {k}:", flush=True)
        alive_at_peak(torch.cuda.memory._snapshot())
        torch.cuda.memory._record_memory_history(enabled=None)

    trainer.memory.step = step


def alive_at_peak(snapshot: dict) -> None:
    """Replay the allocator's trace; at the peak, sum what is alive by its deepest frame in
    our package or torch's Python code."""
    alive: dict[int, tuple[int, str]] = {}
    total, peak, at_peak = 0, 0, {}
    for event in snapshot["device_traces"][0]:
        if event["action"] == "alloc":
            frames = event.get("frames") or []
            where = next(
                (
                    f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}"
                    for f in frames
                    if "dmls" in f["filename"]
                ),
                "?",
            )
            # A library's scratch space (cuDNN's, cuBLAS's) is named in the C++ frames.
            if any("orkspace" in f["name"] for f in frames):
                where += " [workspace]"
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
    for where, size in by_site.most_common(12):
        print(f"    {size / MIB:8.1f} MiB  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--snapshot", default="")
    parser.add_argument("--batches", default="32", help="comma-separated batch sizes")
    parser.add_argument("--steps", default="eager,graph,compile")
    parser.add_argument("--precisions", default="fp32,bf16,fp16")
    parser.add_argument("--one", help="measure only this precision/step/batch (in this process)")
    parser.add_argument("--data", type=Path, help="(with --one) the prepared data")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("a step's GPU memory needs a CUDA GPU; there is none here")
    if args.one:
        precision, step, batch = args.one.split("/")
        ((before, rise),) = measure(
            args.data, precision, step, int(batch), args.one == args.snapshot
        ).values()
        print(
            f"{args.one:16} held before training {before / MIB:7.1f} MiB, steady steps' peak "
            f"above it {rise / MIB:7.1f} MiB",
            flush=True,
        )
        return
    with tempfile.TemporaryDirectory(prefix="dmls-mem-") as tmp:
        data = Path(tmp)
        datasets.prepare("synthetic_cifar", {"n_train": 10000, "n_test": 2000, "seed": 0}, data)
        for step, precision, batch in itertools.product(
            args.steps.split(","), args.precisions.split(","), args.batches.split(",")
        ):
            # Each in a process of its own: nothing an earlier one left counts.
            one = ["--one", f"{precision}/{step}/{batch}", "--data", str(data)]
            subprocess.run(
                [sys.executable, __file__, *one, "--snapshot", args.snapshot], check=True
            )


if __name__ == "__main__":
    main()
