"""Where a 2-GPU DDP job's time goes outside training and evaluation, measured part by part on
an otherwise idle host, and that time against the host's bare `import torch` (issue #41: at
most 2x; the host's speed cancels in the ratio).

    python3 bench/launch_overhead.py [--repeats 3] [--epochs 15] [--run ddp_2gpu]
        [--out overhead.json]

Run through bench/gpu_host.sh's setup, which gives the processes a bytecode cache where the host
has none (dmls/bytecode.py); the output says which. Without that cache, on the lent hosts, each
process compiles torch's modules again.

1. Processes, each started fresh `--repeats` times (wall seconds, and the CPU seconds the
   process used, which tell a CPU-bound import from one that waits on the disk):
   the interpreter alone; `import torch`; `import torch` then `torch._dynamo` (DDP's
   constructor and torch.optim's first optimizer import it); torchrun's agent's own import
   (`torch.distributed.run`); the worker's imports (`dmls.training.trainer`); a CUDA context,
   then torch._dynamo after it or on a thread beside it (whether the import could hide behind
   waiting for the GPU).
2. Where the imports go: `python -X importtime` of the worker's imports and then
   torch._dynamo, the self time summed per top-level package.
3. torchrun's agent with ranks that import nothing (each writes when it started and ended),
   as the supervisor starts it (launch.py: c10d rendezvous) and with the static rendezvous
   torchrun uses by default: from starting the agent to the ranks' start, and from the last
   rank's end to the agent's exit.
   This part starts torchrun itself, not through the supervisor's launcher: it measures the
   agent alone, and the static rendezvous the launcher doesn't use.
4. The floor under any job (`LEAST_RANK`): ranks that do only what every DDP rank does before
   its first step (import torch and torch._dynamo, a CUDA context, the process group and one
   all-reduce), one per GPU (2 gloo ranks without one), started by torchrun's command line and
   by the same elastic agent forking them from a process that imported torch once: the whole
   command's seconds over the bare import. Where torchrun's ratio is already above 2x, no
   engine around the step can bring a job under it.
5. A1's `ddp_2gpu` (or `--run`: `ddp_1gpu` is torchrun's path on a host of one GPU) as the
   DAG runs it (dmls.supervisor.supervise.run, torchrun, 1 seed, data on the GPU, CUDA graphs),
   on a synthetic CIFAR-sized set, `--job-repeats` times: the seconds outside training and
   evaluation, split as the report's DAG timeline splits them (launcher, imports, process
   group, the job's and the first seed's setup, checkpoints, teardown), their mean with a 95%
   interval, and that mean over part 1's median bare `import torch`.
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
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from epoch_speed import ROOT
from seeds_cost import job

from dmls import bytecode
from dmls.data import datasets
from dmls.stats import mean_interval
from dmls.supervisor import launch

SCRIPTS = ROOT / "workflow" / "scripts"
PROCESSES = {
    "interpreter": "pass",
    "import torch": "import torch",
    "import torch, torch._dynamo": "import torch, torch._dynamo",
    "torchrun agent's import": "import torch.distributed.run",
    "worker's imports": "from dmls.training import job",
    "worker's imports, torch._dynamo": "from dmls.training import job; import torch._dynamo",
    "import torch, CUDA context": "import torch; torch.zeros(1, device='cuda')",
    "import torch, CUDA context, torch._dynamo": (
        "import torch; torch.zeros(1, device='cuda'); import torch._dynamo"
    ),
    "the same, torch._dynamo on a thread": (
        "import importlib, threading, torch\n"
        "t = threading.Thread(target=importlib.import_module, args=('torch._dynamo',))\n"
        "t.start(); torch.zeros(1, device='cuda'); t.join()"
    ),
}
BARE_RANK = """import json, os, sys, time
start = time.time()
out = sys.argv[1] + "/rank" + os.environ["RANK"] + ".json"
json.dump({"start": start, "end": time.time()}, open(out, "w"))
"""


# The least any DDP rank does before its first step, whatever the engine around it: import torch
# and torch._dynamo (DDP's constructor and torch.optim's first optimizer import it), a CUDA
# context, the process group and its first collective, then the group's destruction. As a
# function, so that the elastic agent can also fork it from a process that imported torch once.
LEAST_RANK = """
def least_rank(out):
    import json, os, time
    start = time.time()
    import torch, torch._dynamo, torch.distributed as dist
    imported = time.time()
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1, device=device))
    grouped = time.time()
    dist.destroy_process_group()
    times = {"start": start, "imported": imported, "grouped": grouped, "end": time.time()}
    with open(out + "/rank" + os.environ["RANK"] + ".json", "w") as f:
        json.dump(times, f)
"""
# torch's elastic agent, the one torchrun runs, started from a process that imported torch: a
# Python-function entry point may be forked (a script's, torchrun's, is always a new process).
# LaunchConfig asks torch.accelerator whether a GPU is there, which starts CUDA's driver in the
# agent and leaves forked ranks unable to use CUDA ("Cannot re-initialize CUDA in forked
# subprocess", on 1x H200, torch 2.11) unless the count comes from NVML, as torch documents.
FORK_AGENT = """
import os, sys
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
import torch, torch._dynamo
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
config = LaunchConfig(
    min_nodes=1, max_nodes=1, nproc_per_node=int(sys.argv[2]), run_id="bench",
    rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:" + sys.argv[3],
    rdzv_configs={"is_host": True}, max_restarts=0, start_method="fork",
)
elastic_launch(config, least_rank)(sys.argv[1])
"""


def timed_process(code: str) -> tuple[float, float]:
    """Wall and CPU seconds of a fresh `python3 -c code`."""
    env = os.environ | {"PYTHONPATH": f"{SCRIPTS}:{os.environ.get('PYTHONPATH', '')}"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def processes(repeats: int) -> list[dict[str, Any]]:
    import torch

    rows = []
    for name, code in PROCESSES.items():
        if "cuda" in code and not torch.cuda.is_available():
            continue
        runs = [timed_process(code) for _ in range(repeats)]
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        rows.append({"process": name, "wall_s": walls, "cpu_s": cpus})
        print(
            f"{name:<36} wall {statistics.median(walls):6.2f} s, "
            f"CPU {statistics.median(cpus):6.2f} s",
            flush=True,
        )
    return rows


def import_profile(top: int = 12) -> list[tuple[str, float]]:
    """Seconds of import self time per top-level package (torch split one level further)."""
    env = os.environ | {"PYTHONPATH": f"{SCRIPTS}:{os.environ.get('PYTHONPATH', '')}"}
    code = "from dmls.training import job; import torch._dynamo"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    totals: dict[str, float] = defaultdict(float)
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, _, name = line.removeprefix("import time:").split("|")
        parts = name.strip().split(".")
        key = ".".join(parts[:2]) if parts[0] == "torch" else parts[0]
        totals[key] += int(own) / 1e6
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    print(f"import self time, total {sum(totals.values()):.2f} s:", flush=True)
    for name, seconds in ranked[:top]:
        print(f"  {name:<32}{seconds:6.2f} s")
    return ranked[:top]


def bare_torchrun(rdzv: str, port: int) -> dict[str, float]:
    """torchrun with 2 ranks that import nothing: agent start to the ranks' start, and the last
    rank's end to the agent's exit."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(BARE_RANK)
        flags = {
            "c10d": [
                "--rdzv_backend",
                "c10d",
                "--rdzv_endpoint",
                f"127.0.0.1:{port}",
                "--rdzv_id",
                "bench",
                "--rdzv_conf",
                "is_host=true",
            ],
            "static": ["--master_addr", "127.0.0.1", "--master_port", str(port)],
        }[rdzv]
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc_per_node",
            "2",
            *flags,
            "--max_restarts",
            "0",
            str(script),
            tmp,
        ]
        start = time.time()
        subprocess.run(argv, check=True, capture_output=True)
        end = time.time()
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(2)]
    return {
        "to_ranks_s": min(r["start"] for r in ranks) - start,
        "after_ranks_s": end - max(r["end"] for r in ranks),
        "total_s": end - start,
    }


def least_rank_launch(how: str, port: int, nproc: int) -> dict[str, float]:
    """The least DDP rank (LEAST_RANK) on `nproc` processes, started by torchrun's command line
    (c10d rendezvous, as the supervisor starts it) or by the elastic agent forking it from a
    process that imported torch once: the whole command's wall seconds, and its parts."""
    with tempfile.TemporaryDirectory() as tmp:
        if how == "torchrun":
            script = Path(tmp) / "rank.py"
            # Leave as the DAG's ranks do (training/worker.py) and a forked rank does: without
            # the interpreter's finalization.
            script.write_text(LEAST_RANK + "import os, sys\nleast_rank(sys.argv[1])\nos._exit(0)\n")
            # The supervisor's own command; not its thread variables: the host's defaults stay.
            argv = launch.torchrun_command(
                [str(script)],
                [tmp],
                nodes=1,
                nproc_per_node=nproc,
                node_rank=0,
                master_addr=launch.LOOPBACK,
                port=port,
                rdzv_id="bench",
                threads_per_process=1,
            ).argv
        else:
            argv = [sys.executable, "-c", LEAST_RANK + FORK_AGENT, tmp, str(nproc), str(port)]
        start = time.time()
        done = subprocess.run(argv, capture_output=True, text=True)
        end = time.time()
        if done.returncode:
            sys.exit(f"the least DDP rank under {how} failed:\n{done.stderr[-4000:]}")
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(nproc)]
    first = min(r["start"] for r in ranks)
    imported = max(r["imported"] for r in ranks)
    grouped = max(r["grouped"] for r in ranks)
    ended = max(r["end"] for r in ranks)
    return {
        "total_s": end - start,
        "to_ranks_s": first - start,
        "ranks_imports_s": imported - first,
        "process_group_s": grouped - imported,
        "destroy_s": ended - grouped,
        "after_s": end - ended,
    }


def ddp_job(epochs: int, data_dir: Path, work: Path, run: str = "ddp_2gpu") -> dict[str, Any]:
    row = job(run, 1, epochs, data_dir, work)
    split = row["split_s"]
    seed = row["per_seed"][0]
    parts = {
        "launcher": row["launcher_s"],
        "imports": split["import_s"],
        "process group": split["process_group_s"],
        # energy meter, torch._dynamo's import, the collector's freeze (trainer.train)
        "job setup": split["setup_s"] - split["process_group_s"] - seed["setup_s"],
        "first seed's trainer": seed["setup_s"],  # data, model, optimizer, DDP
        "checkpoints": split["checkpoint_time_s"],
        "teardown": split["teardown_s"],
    }
    return {
        "wall_s": row["wall_s"],
        "outside_s": row["outside_training_s"],
        "parts_s": parts,
        "first_epoch_s": seed["first_epoch_s"],
        "steady_epoch_s": seed["steady_epoch_s"],
    }


def floor(repeats: int) -> dict[str, list[dict[str, float]]]:
    """The least DDP rank under each launcher, `repeats` times, each launch paired with a bare
    `import torch` timed just before it (the ratio of a pair cancels the host's drift): the floor
    under any job's overhead (a job adds its supervisor, data, model and teardown)."""
    import torch

    nproc = torch.cuda.device_count() or 2  # gloo's 2 CPU ranks where there is no GPU
    runs: dict[str, list[dict[str, float]]] = defaultdict(list)
    for k in range(repeats):
        for i, how in enumerate(("torchrun", "fork")):
            bare, _ = timed_process(PROCESSES["import torch"])
            row = least_rank_launch(how, 29700 + 2 * k + i, nproc)
            runs[how].append(row | {"import_torch_s": bare, "ratio": row["total_s"] / bare})
    names = {"torchrun": "torchrun's command line", "fork": "the elastic agent, forked"}
    for how, rows in runs.items():
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        print(
            f"the least DDP rank ({nproc} processes) under {names[how]}: {med['total_s']:.2f} s "
            f"(to the ranks {med['to_ranks_s']:.2f}, their imports {med['ranks_imports_s']:.2f}, "
            f"process group {med['process_group_s']:.2f}, its destruction "
            f"{med['destroy_s']:.2f}, after the ranks {med['after_s']:.2f}), "
            f"{med['ratio']:.2f}x a bare import timed just before it "
            f"({min(r['ratio'] for r in rows):.2f}-{max(r['ratio'] for r in rows):.2f}x; "
            f"medians of {repeats})",
            flush=True,
        )
    return dict(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--job-repeats", type=int, help="jobs to time (default: --repeats)")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--run", default="ddp_2gpu", choices=["ddp_2gpu", "ddp_1gpu"])
    parser.add_argument("--out", type=Path, default=Path("launch_overhead.json"))
    parser.add_argument("--no-job", dest="job", action="store_false", help="parts 1-3 only")
    args = parser.parse_args()
    out: dict[str, Any] = {"python": sys.version.split()[0], "bytecode": bytecode.describe()}
    print(f"Python {out['python']}, bytecode {out['bytecode']}", flush=True)
    out["processes"] = processes(args.repeats)
    out["import_profile"] = import_profile()
    bare = defaultdict(list)
    for k in range(args.repeats):
        for rdzv in ("c10d", "static"):
            bare[rdzv].append(bare_torchrun(rdzv, 29600 + 2 * k + (rdzv == "static")))
    out["bare_torchrun"] = bare
    for rdzv, runs in bare.items():
        to_ranks = statistics.median(r["to_ranks_s"] for r in runs)
        after = statistics.median(r["after_ranks_s"] for r in runs)
        print(
            f"torchrun ({rdzv}), ranks importing nothing: to the ranks {to_ranks:.2f} s, "
            f"after them {after:.2f} s",
            flush=True,
        )
    bare = statistics.median(
        next(r["wall_s"] for r in out["processes"] if r["process"] == "import torch")
    )
    out["import_torch_s"] = bare
    out["least_rank"] = floor(args.repeats)
    if args.job:
        work = Path(tempfile.mkdtemp(prefix="dmls-overhead-"))
        datasets.prepare(
            "synthetic_cifar", {"n_train": 50000, "n_test": 10000, "seed": 0}, work / "data"
        )
        out["jobs"] = []
        for k in range(args.job_repeats or args.repeats):
            row = ddp_job(args.epochs, work / "data", work / f"job{k}", args.run)
            out["jobs"].append(row)
            parts = ", ".join(f"{p} {s:.2f}" for p, s in row["parts_s"].items())
            print(
                f"{args.run}, {args.epochs} epochs: job {row['wall_s']:.1f} s, outside "
                f"training and evaluation {row['outside_s']:.2f} s ({parts})",
                flush=True,
            )
        outside = mean_interval([j["outside_s"] for j in out["jobs"]])
        out["outside_s"] = {"mean": outside.mean, "low": outside.low, "high": outside.high}
        span = f", 95% interval {outside.low:.2f}-{outside.high:.2f} s" if outside.n > 1 else ""
        out["ratio"] = outside.mean / bare
        print(
            f"outside training and evaluation: {outside.mean:.2f} s{span}, "
            f"{out['ratio']:.2f}x this host's bare `import torch` ({bare:.2f} s, the median of "
            f"{args.repeats}; target: at most 2x)",
            flush=True,
        )
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
