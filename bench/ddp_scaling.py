"""What limits DDP scaling of the course CNN: one GPU against two, and where a step's time goes.

    python3 bench/ddp_scaling.py [--out ddp.json]                       # on a 2-GPU host
    python3 bench/ddp_scaling.py --device cpu --n-train 512 --epochs 2  # the CPU path (CI)

Each variant trains the A1 CNN (config/config.yaml, batch 128 per process, `loader: device`,
synthetic CIFAR-shaped data) with the pipeline's own Trainer, one process per GPU, for a few
epochs, and reports:
- s/epoch (median after the first epoch) and the speed-up of two processes over one;
- from a torch.profiler trace of one more epoch: per step, the wall time, the time the GPU was
  busy (union of kernel intervals), the NCCL kernels' share of it, and the host's time inside
  cudaGraphLaunch (long when the launch queue is full: the GPU, not the host, is the limit);
- for two processes: one all-reduce of a buffer the size of the gradients, alone (µs).
Two-process variants are compared with the one-process run of the same step (graph or
compile). Some change DDP's own settings (see VARIANTS), to measure them before the engine
adopts them; so far none beat its defaults (docs/performance.md, "What limits DDP").

Ranks start here with torch.multiprocessing.spawn, not the supervisor's launcher
(dmls/supervisor/launch.py): each rank wraps the engine's Trainer to change DDP's own arguments
(`ddp_kwargs`) and profile one epoch in-process, which a launched worker doesn't expose. What is
measured (an epoch's steps, in the ranks) starts after the launcher's part and doesn't depend
on it; the launcher's own cost is bench/launch_overhead.py's.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from epoch_speed import a1_spec  # noqa: E402

from dmls.config.spec import RunSpec, deep_merge  # noqa: E402
from dmls.data import datasets  # noqa: E402
from dmls.training.parallel import strategy_for  # noqa: E402
from dmls.training.trainer import Trainer  # noqa: E402


@dataclass(frozen=True)
class Variant:
    processes: int
    step: str  # graph | compile
    ddp_kwargs: dict = field(default_factory=dict)  # DistributedDataParallel's own settings
    env: dict = field(default_factory=dict)


BUCKET_VIEW = {"gradient_as_bucket_view": True}  # gradients are views of DDP's buckets: no copies
VARIANTS = {
    "one_graph": Variant(1, "graph"),
    "one_compile": Variant(1, "compile"),
    "ddp_graph": Variant(2, "graph"),
    "ddp_compile": Variant(2, "compile"),
    "ddp_graph_bucket_view": Variant(2, "graph", BUCKET_VIEW),
    # One all-reduce at the end of the backward instead of two (the first overlaps it).
    "ddp_graph_one_bucket": Variant(2, "graph", BUCKET_VIEW | {"bucket_cap_mb": 64}),
    # No broadcast of BatchNorm's running statistics from rank 0 before each forward (a
    # collective that starts every step). Measurement only: ranks' statistics then drift apart.
    "ddp_graph_local_buffers": Variant(2, "graph", BUCKET_VIEW | {"broadcast_buffers": False}),
    # NCCL's support for captured and uncaptured collectives outstanding at once costs extra
    # synchronisation in every replay (NCCL's "Using NCCL with CUDA Graphs").
    "ddp_graph_no_mixing": Variant(2, "graph", env={"NCCL_GRAPH_MIXING_SUPPORT": "0"}),
}
DDP = {"launcher": "torchrun", "nproc_per_node": 2}


def trace_summary(path: Path, steps: int) -> dict[str, float]:
    """Per step, in µs: wall, GPU busy (union of kernel intervals), NCCL kernel time (which
    includes waiting for the other rank) and host time in cudaGraphLaunch."""
    events = json.loads(path.read_text())["traceEvents"]
    kernels = sorted(
        (e["ts"], e["ts"] + e["dur"], "nccl" in e["name"].lower(), e["name"])
        for e in events
        if e.get("cat") == "kernel" and "dur" in e
    )
    if not kernels:
        return {}
    nccl_names: dict[str, int] = {}
    for *_, is_nccl, kernel in kernels:
        if is_nccl:
            nccl_names[kernel[:60]] = nccl_names.get(kernel[:60], 0) + 1
    busy, nccl, end = 0.0, 0.0, float("-inf")
    for start, stop, is_nccl, _ in kernels:
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
        nccl += (stop - start) if is_nccl else 0.0
    span = kernels[-1][1] - kernels[0][0]
    # Host time inside cudaGraphLaunch: long when the launch queue is full, i.e. the host is
    # ahead and the GPU is the bottleneck.
    launch = sum(e.get("dur", 0) for e in events if e.get("name") == "cudaGraphLaunch")
    return {
        "kernels_per_step": len(kernels) / steps,
        "span_us_per_step": span / steps,
        "gpu_busy_us_per_step": busy / steps,
        "nccl_us_per_step": nccl / steps,
        "graph_launch_us_per_step": launch / steps,
        "nccl_kernels_per_step": {k: n / steps for k, n in nccl_names.items()},
    }


def allreduce_us(numel: int, device: torch.device, iters: int = 200) -> float:
    import torch.distributed as dist

    buf = torch.ones(numel, device=device)
    for _ in range(20):
        dist.all_reduce(buf)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    sync()
    return (time.perf_counter() - t0) / iters * 1e6


def worker(rank: int, world: int, port: int, args: dict[str, Any]) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        **args["env"],
    )
    if args["ddp_kwargs"]:
        ddp = torch.nn.parallel.DistributedDataParallel
        patched = type("DDP", (ddp,), {})
        patched.__init__ = functools.partialmethod(ddp.__init__, **args["ddp_kwargs"])
        torch.nn.parallel.DistributedDataParallel = patched
    spec = RunSpec.from_json(args["spec"])
    strategy = strategy_for(spec)
    env = strategy.join()
    trainer = Trainer(spec, strategy, env, Path(args["data_dir"]))
    epochs = []
    for epoch in range(spec.epochs - 1):  # the last epoch is profiled
        trainer.synchronize()
        t0 = time.perf_counter()
        trainer.train_epoch(epoch)
        trainer.synchronize()
        epochs.append(time.perf_counter() - t0)
    result: dict[str, Any] = {"epochs_s": epochs, "step": trainer.step_record()}
    activities = [torch.profiler.ProfilerActivity.CPU]
    if env.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        trainer.train_epoch(spec.epochs - 1)
        trainer.synchronize()
    trace = Path(args["out"]) / f"trace-{spec.run}-rank{rank}.json"
    prof.export_chrome_trace(str(trace))
    result["profile"] = trace_summary(trace, len(trainer.data.train))
    # Where the host's time went (self CPU time, whole epoch): the step is host-bound where the
    # GPU idles between kernels.
    result["host_ops"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
    result["steps_per_epoch"] = len(trainer.data.train)
    numel = sum(p.numel() for p in trainer.model.parameters())
    result["parameters"] = numel
    if world > 1:
        result["allreduce_grads_us"] = allreduce_us(numel, env.device)
    if rank == 0:
        (Path(args["out"]) / f"{spec.run}.json").write_text(json.dumps(result))
    trainer.step.release()
    strategy.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as workflow/scripts/rank.py: no interpreter shutdown under a process group


def run_variant(name: str, base: dict, data_dir: Path, out: Path) -> dict[str, Any]:
    import torch.multiprocessing as mp

    variant = VARIANTS[name]
    launcher = DDP if variant.processes > 1 else {"launcher": "single"}
    spec = a1_spec(name, **deep_merge(base, launcher | {"step": variant.step}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = {"spec": spec.to_json(), "data_dir": str(data_dir), "out": str(out),
            "ddp_kwargs": variant.ddp_kwargs, "env": variant.env}  # fmt: skip
    print(f"-- {name}", file=sys.stderr, flush=True)
    mp.spawn(worker, args=(variant.processes, port, args), nprocs=variant.processes)
    result = json.loads((out / f"{spec.run}.json").read_text())
    steady = result["epochs_s"][1:] or result["epochs_s"]
    row = {
        "name": name,
        "processes": variant.processes,
        "requested_step": variant.step,
        "batch_per_process": spec.batch_size,
        "steady_epoch_s": statistics.median(steady),
    }
    return row | result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--n-train", type=int, default=50_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--host-ops", action="store_true", help="print each variant's host ops")
    parser.add_argument("--traces", type=Path, help="keep the profiler traces here")
    args = parser.parse_args()
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    if args.device == "cuda" and gpus < 2:
        sys.exit(f"--device cuda needs 2 GPUs, found {gpus}")
    base = {"dataset": "synthetic_cifar", "device": args.device, "epochs": args.epochs + 1,
            "batch_size": args.batch, "loader": "device"}  # fmt: skip
    if args.device == "cpu":
        base |= {"backend": "gloo", "model": {"conv_channels": [8, 16], "fc_hidden": 32}}
    with tempfile.TemporaryDirectory(prefix="dmls-ddp-") as tmp:
        work = Path(tmp)
        traces = args.traces or work
        traces.mkdir(parents=True, exist_ok=True)
        datasets.prepare(
            "synthetic_cifar", {"n_train": args.n_train, "n_test": 1000, "seed": 0}, work
        )
        rows = [run_variant(name, base, work, traces) for name in args.variants]
    where = f"{gpus}× {torch.cuda.get_device_name(0)}" if gpus else "CPU"
    host = f"{socket.gethostname()}: {where}, torch {torch.__version__}"
    print(f"\n{host}, batch {args.batch} per process")
    one = {r["requested_step"]: r for r in rows if r["processes"] == 1}
    header = f"{'variant':<24}{'s/epoch':>9}{'vs one':>8}{'wall µs':>9}{'busy µs':>9}"
    print(header + f"{'nccl µs':>9}{'launch µs':>10}{'kernels':>9}{'allreduce µs':>13}  step")
    for r in rows:
        ref = one.get(r["requested_step"]) if r["processes"] > 1 else None
        vs = f"{ref['steady_epoch_s'] / r['steady_epoch_s']:.2f}×" if ref else "-"
        p = r["profile"]
        cells = [f"{r['name']:<24}", f"{r['steady_epoch_s']:9.3f}", f"{vs:>8}"]
        cells += [
            f"{p.get(k, float('nan')):{w}.0f}"
            for k, w in (
                ("span_us_per_step", 9),
                ("gpu_busy_us_per_step", 9),
                ("nccl_us_per_step", 9),
                ("graph_launch_us_per_step", 10),
                ("kernels_per_step", 9),
            )
        ]
        ar = r.get("allreduce_grads_us")
        cells.append(f"{ar:13.0f}" if ar is not None else f"{'-':>13}")
        mode = r["step"].get("mode", "?") + ("+compile" if r["step"].get("compiled") else "")
        print("".join(cells) + f"  {mode}")
    for r in rows:
        print(f"\n{r['name']}: NCCL kernels per step {r['profile'].get('nccl_kernels_per_step')}")
        if args.host_ops:
            print(r["host_ops"])
    if args.out:
        args.out.write_text(
            json.dumps({"gpus": where, "torch": torch.__version__, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
