"""DataParallel's step, stock and on persistent threads, against one GPU's eager step (A1).

    python3 bench/dataparallel_threads.py [--repeats 3] [--out dp.json] [--profile] [--phases]
        (2 GPUs; --repeats trains each row that many times, interleaved, for an interval)

Stock nn.DataParallel runs its replicas' forwards on new threads every step; cuDNN caches its
convolution execution plans per thread, so each step builds them again. `replica_threads:
persistent` (dmls/training/threaded_dp.py, ThreadedDataParallel) runs the first GPU's replica
on the calling thread and each other GPU's on a thread of its own that lives as long as the
model, and keeps the replicas whole between steps (PersistentReplicas: each step copies the
weights in, and the backward ends by summing their gradients onto GPU 0). Each row
is one training of the pipeline's own engine with A1's model and settings, batch 32 per GPU,
data on the GPU, eager steps (DataParallel can't replay a CUDA graph), on a synthetic
CIFAR-shaped set; a step's time is the steady epoch (median of epochs 2..E) over its steps.
The target (issue #17): the persistent step at most 2x the single-GPU eager step. Also timed:
starting and joining the two threads stock DataParallel starts per step, alone.

With --profile, one epoch of each DataParallel run again under torch.profiler: the host time
inside the forward convolutions (aten::cudnn_convolution, inclusive: where cuDNN builds an
execution plan when its thread has none cached) per step, against the step. Stock minus
persistent is what rebuilding the plans costs; the rest of the gap to one GPU is
DataParallel's own work (scatter, replicate, gather, the threads).

With --phases, a warm epoch of each run again (after a first epoch and an evaluation, as fit()
runs them) without the profiler, its host time per step
split by part (phase_split): DataParallel's scatter, replicate, the replicas' forwards and
gather, and what follows the forward (loss, backward, optimizer step), of which, persistent,
the summing of the other GPU's gradients at the end of the backward.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from epoch_speed import ROOT, a1_spec, train_once

sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from dmls.data import datasets
from dmls.stats import ratio

DP = {"launcher": "dp", "nproc_per_node": 2}
ROWS = {
    "single_gpu_eager": {},
    "dataparallel_stock": DP,
    "dataparallel_persistent": DP | {"replica_threads": "persistent"},
}


class CollectorTime:
    """How many collections of each generation Python's garbage collector ran, and their
    seconds, while in use (gc.callbacks)."""

    def __init__(self) -> None:
        self.counts, self.seconds, self._start = [0, 0, 0], [0.0, 0.0, 0.0], 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.counts[info["generation"]] += 1
            self.seconds[info["generation"]] += time.perf_counter() - self._start

    def __enter__(self) -> CollectorTime:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def step_ms(name: str, base: dict, data_dir: Path, work: Path) -> dict[str, Any]:
    spec = a1_spec(name, **(base | ROWS[name]))
    with CollectorTime() as collector:
        result = train_once(spec, data_dir, work)
    per_step = spec.batch_size * (spec.nproc_per_node if spec.launcher == "dp" else 1)
    steps = math.ceil(result["data"]["n_train"] / per_step)
    steady = result["timing"]["steady_epoch_s"]
    return {
        "name": name,
        "steps_per_epoch": steps,
        "steady_epoch_s": steady,
        "step_ms": 1000 * steady / steps,
        "epochs_s": [h["train_time_s"] for h in result["history"]],
        "gc_collections": collector.counts,
        "gc_s": collector.seconds,
        "test_accuracy": result["final"]["test_accuracy"],
    }


def profile_split(name: str, base: dict, data_dir: Path) -> dict[str, Any]:
    """One warm epoch of run `name` under the profiler: ms per step, and of it the host time in
    the forward and backward convolution ops (inclusive), from the trace's operator totals."""
    from dmls.training.parallel import strategy_for
    from dmls.training.trainer import Trainer

    spec = a1_spec(name, **(base | ROWS[name] | {"epochs": 2}))
    strategy = strategy_for(spec)
    process = strategy.join()
    trainer = Trainer(spec, strategy, process, data_dir)
    trainer.train_epoch(0)  # warm: every thread that persists has its plans now
    trainer.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    # DataParallel's forwards run on threads the profiler does not follow by default.
    every_thread = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    with torch.profiler.profile(activities=activities, experimental_config=every_thread) as prof:
        start = time.perf_counter()
        trainer.train_epoch(1)
        trainer.synchronize()
        seconds = time.perf_counter() - start
    steps = len(trainer.data.train)
    totals = {e.key: e for e in prof.key_averages()}

    def per_step_ms(op: str) -> tuple[float, float]:
        event = totals.get(op)
        return (event.cpu_time_total / 1000 / steps, event.count / steps) if event else (0.0, 0.0)

    forward_ms, forward_calls = per_step_ms("aten::cudnn_convolution")
    backward_ms, backward_calls = per_step_ms("aten::convolution_backward")
    trainer.release()
    strategy.end_seed()
    return {
        "name": name,
        "profiled_step_ms": 1000 * seconds / steps,
        "conv_forward_host_ms_per_step": forward_ms,
        "conv_forward_calls_per_step": forward_calls,
        "conv_backward_host_ms_per_step": backward_ms,
        "conv_backward_calls_per_step": backward_calls,
    }


def phase_split(name: str, base: dict, data_dir: Path) -> dict[str, Any]:
    """Host milliseconds per step of a warm epoch of run `name`, by part, timed with
    perf_counter around the wrapped model's forward and, under DataParallel, around its scatter,
    replicate, parallel_apply (the replicas' forwards) and gather. What the forward leaves is
    the loss, the backward (both GPUs' on autograd's device threads, then the gradients summed
    on GPU 0) and the optimizer step. No profiler: its per-op cost would inflate a host-bound
    step."""
    from dmls.training.parallel import strategy_for
    from dmls.training.trainer import Trainer

    spec = a1_spec(name, **(base | ROWS[name] | {"epochs": 2}))
    strategy = strategy_for(spec)
    process = strategy.join()
    trainer = Trainer(spec, strategy, process, data_dir)
    trainer.train_epoch(0)
    trainer.evaluate()  # as fit() does between epochs
    trainer.synchronize()
    seconds: dict[str, float] = dict.fromkeys(["forward"], 0.0)

    def timed(part: str, call: Any) -> Any:
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                seconds[part] = seconds.get(part, 0.0) + time.perf_counter() - start

        return wrapper

    module = trainer.module
    module.forward = timed("forward", module.forward)
    if isinstance(module, torch.nn.DataParallel):
        for part in ("scatter", "replicate", "parallel_apply", "gather"):
            setattr(module, part, timed(part, getattr(module, part)))
    replicas = getattr(module, "replicas", None)
    builds = replicas.builds if replicas else 0
    if replicas:  # queued on autograd's engine at the end of each backward
        replicas.sum_gradients = timed("sum_gradients", replicas.sum_gradients)
    with CollectorTime() as collector:
        start = time.perf_counter()
        trainer.train_epoch(1)
        trainer.synchronize()
        step = time.perf_counter() - start
    steps = len(trainer.data.train)
    counts = {
        "gc_collections_by_generation": collector.counts,
        "replica_builds": (replicas.builds - builds) if replicas else None,
    }
    trainer.release()
    strategy.end_seed()
    split = {f"{part}_ms": 1000 * s / steps for part, s in seconds.items()}
    return {
        "name": name,
        "step_ms": 1000 * step / steps,
        **split,
        "after_forward_ms": 1000 * (step - seconds["forward"]) / steps,
        **counts,
    }


def thread_start_ms(repeats: int = 1000) -> float:
    """Milliseconds to start and join two threads that do nothing: what stock DataParallel's
    new threads cost by themselves, per step."""
    start = time.perf_counter()
    for _ in range(repeats):
        threads = [threading.Thread(target=lambda: None) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return 1000 * (time.perf_counter() - start) / repeats


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run: its step over the repeats, and its ratio to one GPU's eager step with a 95%
    interval (dmls.stats.ratio: Welch on the logs; none from one repeat)."""
    by_name: dict[str, list[float]] = {}
    for r in rows:
        by_name.setdefault(r["name"], []).append(r["step_ms"])
    single = by_name.get("single_gpu_eager", [])
    out = []
    for name, steps in by_name.items():
        row = {"name": name, "step_ms": steps, "mean_step_ms": statistics.fmean(steps)}
        if single and name != "single_gpu_eager":
            r = ratio(steps, single)
            row |= {"ratio_to_single": r.value, "ratio_interval": [r.low, r.high]}
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-train", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1, help="trainings per row, interleaved")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--phases", action="store_true", help="host time per step by part")
    parser.add_argument("--no-time", dest="time", action="store_false", help="profile only")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    args = parser.parse_args()
    if torch.cuda.device_count() < 2:
        sys.exit("needs 2 CUDA GPUs")
    base = {"dataset": "synthetic_cifar", "device": "cuda", "epochs": args.epochs,
            "loader": "device", "step": "eager", "num_workers": 0}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="dmls-dp-") as tmp:
        work = Path(tmp)
        datasets.prepare("synthetic_cifar", {"n_train": args.n_train, "n_test": 2000}, work)
        rows = []
        for k in range(args.repeats if args.time else 0):
            for name in args.rows:
                rows.append(step_ms(name, base, work, work / f"r{k}") | {"repeat": k})
                row = rows[-1]
                print(
                    f"repeat {k}: {name} {row['step_ms']:.2f} ms/step, epochs "
                    f"{[round(e, 3) for e in row['epochs_s']]} s, garbage collections by "
                    f"generation {row['gc_collections']} in "
                    f"{[round(c, 3) for c in row['gc_s']]} s",
                    flush=True,
                )
        profiles = [profile_split(n, base, work) for n in args.rows] if args.profile else []
        phases = [phase_split(n, base, work) for n in args.rows] if args.phases else []
    table = summary(rows)
    print(f"{torch.cuda.get_device_name(0)} x2, torch {torch.__version__}")
    print(f"{'run':<26}{'ms/step (each repeat)':>34}{'vs 1 GPU (95% interval)':>30}")
    for r in table:
        steps = " ".join(f"{s:.2f}" for s in r["step_ms"])
        vs = (
            (
                f"{r['ratio_to_single']:.2f}x ({r['ratio_interval'][0]:.2f}-"
                f"{r['ratio_interval'][1]:.2f})"
            )
            if "ratio_to_single" in r
            else ""
        )
        print(f"{r['name']:<26}{steps:>34}{vs:>30}")
    threads_ms = thread_start_ms()
    print(f"starting and joining 2 threads, alone: {threads_ms:.3f} ms")
    print("target: dataparallel_persistent <= 2x single_gpu_eager")
    for p in profiles + phases:
        print(json.dumps(p))
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "gpu": torch.cuda.get_device_name(0),
                    "torch": torch.__version__,
                    "rows": rows,
                    "summary": table,
                    "profiles": profiles,
                    "phases": phases,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
