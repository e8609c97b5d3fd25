"""Why B1's two processes on one host step slower than one (issue #30, item 6): the B model's
training step (ClusterMLP 512-32-20 with batch norm, batch 32, Adam, gloo on CPUs) timed part by
part under settings that each change one thing, on an otherwise idle host.

    python3 bench/one_host_step.py [--steps 1500] [--threads 4] [--out one_host_step.json]

Each setting starts fresh processes pinned to its cores (`taskset`), as B1's runs are pinned to
the cores they reserve (`isolation: devices`: `cluster.cpus_per_process` cores per process):

- alone, plain:      one process, no DDP, `--threads` threads on as many cores
- alone, DDP:        the same under torchrun and DDP (world 1), as B1's n1xp1
- two beside:        two plain processes at once on 2 × `--threads` cores, no communication
- two DDP:           torchrun, 2 ranks with `--threads` threads each on 2 × `--threads` cores, as
                     B1's n1xp2
- two DDP, passive:  the same with OMP_WAIT_POLICY=PASSIVE (idle OpenMP threads sleep at once)
- two DDP, 1 thread: the same with one intra-op thread per rank (no OpenMP workers)
- two DDP, roomy:    the same threads on twice the cores
- two DDP, no buffer broadcast: DDP(broadcast_buffers=False), without its per-forward
                     broadcast of the batch-norm statistics

Per setting and rank: median ms of the step and of its forward (with DDP's buffer broadcast),
backward (with the gradient all-reduce's wait) and optimizer step; the mean step; involuntary
context switches per 1,000 steps (the kernel taking a core from a runnable thread). The first
200 steps are warm-up. Nothing here is a timed test: the numbers go in the issue's note.

Its DDP settings start torchrun (`--standalone`) directly under `taskset`, not through the
supervisor's launcher (dmls/supervisor/launch.py): each setting changes one thing of the bare
step (threads, cores, the wait policy, DDP's buffer broadcast), with no engine, seed loop or
supervisor around it. B1's runs in the report go through the launcher; this takes their step
apart.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

WARMUP = 200


def worker(steps: int, threads: int, ddp: bool, broadcast_buffers: bool) -> None:
    """One rank: time `steps` steps of the B model, write its row."""
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 20))
    if ddp:
        dist.init_process_group("gloo")
        # (torch 2.14 deprecates the keyword for forward_sync_buffers, which 2.11 lacks.)
        warnings.filterwarnings("ignore", "`broadcast_buffers` is deprecated")
        off = {} if broadcast_buffers else {"broadcast_buffers": False}
        model = nn.parallel.DistributedDataParallel(model, **off)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    x, y = torch.randn(32, 512), torch.randint(0, 20, (32,))
    parts: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": [], "step": []}
    switches = 0
    for i in range(steps):
        if i == WARMUP:
            switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
        t0 = time.perf_counter()
        loss = criterion(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if i >= WARMUP:
            for key, seconds in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t3 - t0), strict=True):
                parts[key].append(seconds)
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - switches
    timed = steps - WARMUP
    row = {f"{k}_ms": round(1000 * statistics.median(v), 3) for k, v in parts.items()}
    row |= {
        "mean_step_ms": round(1000 * statistics.mean(parts["step"]), 3),
        "switches_per_1000_steps": round(1000 * switches / timed),
        "rank": int(os.environ.get("RANK", 0)),
    }
    # One file per rank: torchrun's ranks share one stdout, where lines can interleave.
    (Path(os.environ["ONE_HOST_STEP_ROWS"]) / f"{os.getpid()}.json").write_text(json.dumps(row))
    if ddp:
        dist.destroy_process_group()


def settings(threads: int) -> list[dict]:
    n, cores = threads, os.cpu_count() or 1
    if cores < 2 * n:
        raise SystemExit(f"needs {2 * n} cores for two processes of --threads {n}; has {cores}")
    two = f"0-{2 * n - 1}"
    return [
        s
        for s in [
            {"name": "alone, plain", "procs": 1, "ddp": False, "cores": f"0-{n - 1}", "threads": n},
            {"name": "alone, DDP", "procs": 1, "ddp": True, "cores": f"0-{n - 1}", "threads": n},
            {"name": "two beside", "procs": 2, "ddp": False, "cores": two, "threads": n},
            {"name": "two DDP", "procs": 2, "ddp": True, "cores": two, "threads": n},
            {
                "name": "two DDP, passive",
                "procs": 2,
                "ddp": True,
                "cores": two,
                "threads": n,
                "env": {"OMP_WAIT_POLICY": "PASSIVE"},
            },
            {"name": "two DDP, 1 thread", "procs": 2, "ddp": True, "cores": two, "threads": 1},
            {
                "name": "two DDP, roomy",
                "procs": 2,
                "ddp": True,
                "cores": f"0-{4 * n - 1}",
                "threads": n,
            },
            {
                "name": "two DDP, no buffer broadcast",
                "procs": 2,
                "ddp": True,
                "cores": two,
                "threads": n,
                "broadcast_buffers": False,
            },
        ]
        if int(s["cores"].split("-")[1]) < cores  # the roomy one needs 4 × --threads cores
    ]


def measure(setting: dict, steps: int, port: int) -> list[dict]:
    threads = str(setting["threads"])
    me = [
        str(Path(__file__).resolve()),
        "--worker",
        "--steps",
        str(steps),
        "--threads",
        threads,
        *(["--ddp"] if setting["ddp"] else []),
        *([] if setting.get("broadcast_buffers", True) else ["--no-broadcast-buffers"]),
    ]
    env = os.environ | {"OMP_NUM_THREADS": threads} | setting.get("env", {})
    pin = ["taskset", "-c", setting["cores"], sys.executable]
    if setting["ddp"]:
        launch = [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(setting["procs"]),
            "--master_port",
            str(port),
        ]
        commands = [pin + launch + me]
    else:
        commands = [pin + me] * setting["procs"]
    with tempfile.TemporaryDirectory() as folder:
        env["ONE_HOST_STEP_ROWS"] = folder
        running = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL) for c in commands]
        for p in running:
            if p.wait():
                raise SystemExit(f"{setting['name']}: exit {p.returncode}")
        rows = [json.loads(f.read_text()) for f in Path(folder).glob("*.json")]
    return sorted(rows, key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=4, help="B1's cluster.cpus_per_process")
    parser.add_argument("--out", type=Path, default=Path("one_host_step.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ddp", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-broadcast-buffers", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.threads, args.ddp, not args.no_broadcast_buffers)
        return
    import torch

    results = []
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {args.steps} steps per setting")
    print(
        f"{'setting':30} {'step':>7} {'mean':>7} {'fwd':>7} {'bwd':>7} {'opt':>7} {'switches':>9}"
    )
    for i, setting in enumerate(settings(args.threads)):
        rows = measure(setting, args.steps, 29500 + i)
        results.append({k: v for k, v in setting.items()} | {"ranks": rows})
        worst = max(rows, key=lambda r: r["mean_step_ms"])  # a step waits for the slower rank
        cells = [worst[k] for k in ("step_ms", "mean_step_ms", "forward_ms", "backward_ms")]
        cells.append(worst["optimizer_ms"])
        line = " ".join(f"{c:7.3f}" for c in cells)
        print(f"{setting['name']:30} {line} {worst['switches_per_1000_steps']:9,}", flush=True)
    host = {"torch": torch.__version__, "cores": os.cpu_count(), "steps": args.steps}
    args.out.write_text(json.dumps({"host": host, "settings": results}, indent=1))
    print(f"ms per step (median, mean) and its parts' medians; wrote {args.out}")


if __name__ == "__main__":
    main()
