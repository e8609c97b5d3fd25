"""A5 explained: all-reduce, all-gather and reduce-scatter against message size.

For each number of processes in `processes`, that many processes on this host join one
process group per (backend, tensor device) of `setups`: NCCL on CUDA tensors, Gloo on CPU
tensors, and Gloo on CUDA tensors (what A5's `gloo_*` runs do: Gloo copies them through host
memory). Gloo on CPU tensors also runs between nodes: `gloo-cpu-nodes` splits the ranks over 2
emulated nodes, each started by its own torchrun agent, as the engine emulates B's nodes on one
host; `gloo-cpu-slurm` runs them on 2 nodes of the Slurm cluster this host submits to, one
srun step starting a torchrun agent on each node as a multi-node training run's does (skipped
with the reason without a cluster). The ranks are started, and stopped when one fails, as a
training run's are (special/ranks.py). For each collective
and message size (powers of `size_factor` from `min_bytes` to `max_bytes`), `warmup` calls
are timed to size the loop (as nccl-tests and the OSU benchmarks size theirs by time): as many
calls as fit in `time_budget_s` by the slowest rank's warm-up median, at least
`min_iterations` and at most `iterations`, are each timed between barriers on rank 0; the
latency is their median, with its distribution-free 95% interval (stats.median_interval).
Bandwidths follow nccl-tests' definitions (`size` is the whole message: the all-reduced
buffer, all-gather's output, reduce-scatter's input; n ranks):
  algbw = size / time;  busbw = algbw × 2(n−1)/n for all-reduce, × (n−1)/n for the others,
which makes busbw comparable with the hardware's link bandwidth whatever the collective.
The figure marks the course CNN's gradient (what DDP all-reduces each step, in fp32) and DDP's
default bucket (25 MiB).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dmls import stats
from dmls.comm import DDP_BUCKET_BYTES
from dmls.data import datasets
from dmls.files import new_figure, save_figure, write_csv
from dmls.protocol import as_rank
from dmls.special import error_line, ranks
from dmls.supervisor.slurm import SlurmError, SlurmJob
from dmls.training.models import course_cnn

log = logging.getLogger(__name__)

OPS = ("all_reduce", "all_gather", "reduce_scatter")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n}  # fmt: skip
# Where a setup's ranks run (the last part of its name in `setups`; none: one host).
PLACEMENTS = {"host": "one host", "nodes": "2 emulated nodes", "slurm": "2 Slurm nodes"}
COLUMNS = (
    "backend", "device", "placement", "op", "processes", "size_bytes", "status", "reason",
    "latency_us", "latency_low_us", "latency_high_us", "calls", "algbw_gb_s", "busbw_gb_s",
)  # fmt: skip


def course_gradient(cfg: dict[str, Any]) -> dict[str, Any]:
    """The gradient DDP all-reduces every step (fp32) of the CNN the A runs train: the model
    and data set of the config's defaults (`gradient_model`, set by the rule), else the course
    CNN on CIFAR-10. Its bytes, parameters and data set, for the summary."""
    model_cfg = cfg.get("gradient_model") or {}
    dataset = model_cfg.get("dataset", "cifar10")
    input_shape, classes = datasets.shape(dataset)
    sizes = {k: model_cfg[k] for k in ("conv_channels", "fc_hidden") if k in model_cfg}
    parameters = sum(p.numel() for p in course_cnn(input_shape, classes, **sizes).parameters())
    return {"bytes": 4 * parameters, "parameters": parameters, "dataset": dataset}


def sizes(cfg: dict[str, Any]) -> list[int]:
    out, size = [], cfg["min_bytes"]
    while size <= cfg["max_bytes"]:
        out.append(size)
        size *= cfg["size_factor"]
    return out


def calls(warm_seconds: float, cfg: dict[str, Any]) -> int:
    """How many calls to time: as many as fit in `time_budget_s` at `warm_seconds` a call,
    at least `min_iterations`, never more than `iterations`."""
    fit = int(cfg["time_budget_s"] / warm_seconds) if warm_seconds > 0 else cfg["iterations"]
    return min(cfg["iterations"], max(cfg["min_iterations"], fit))


def _time_op(
    op: str, size: int, world: int, device: torch.device, cfg: dict
) -> dict[str, float | int | None]:
    """The median seconds of one call of `op` on a message of `size` bytes (fp32 elements),
    its 95% interval and the calls timed (`calls`, agreed by all ranks: the slowest rank's
    warm-up median sets it)."""
    numel = max(world, size // 4 // world * world)  # divisible by the ranks, at least one each
    shard = numel // world
    if op == "all_reduce":
        buffer = torch.ones(numel, device=device)

        def call() -> None:
            dist.all_reduce(buffer)
    elif op == "all_gather":
        piece, whole = torch.ones(shard, device=device), torch.empty(numel, device=device)

        def call() -> None:
            dist.all_gather_into_tensor(whole, piece)
    else:
        whole, piece = torch.ones(numel, device=device), torch.empty(shard, device=device)

        def call() -> None:
            dist.reduce_scatter_tensor(piece, whole)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed() -> float:
        sync()
        dist.barrier()
        start = time.perf_counter()
        call()
        sync()
        return time.perf_counter() - start

    warm = [timed() for _ in range(max(cfg["warmup"], 1))]
    slowest = torch.tensor([statistics.median(warm)], device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # (every rank times as many calls)
    times = [timed() for _ in range(calls(float(slowest.item()), cfg))]
    median, low, high = stats.median_interval(times)
    return {"seconds": median, "low": low, "high": high, "calls": len(times)}


def _worker(world: int, backend: str, device_type: str, cfg: dict, out: str, reports: str) -> None:
    """One rank of a sweep (a process of its own, started by `sweep` through torchrun); rank 0
    writes the timings to `out`, a rank that fails its error to
    `reports`."""
    with as_rank(Path(reports)) as rank:
        _time_every_op(rank, world, backend, device_type, cfg, out)


def _time_every_op(
    rank: int, world: int, backend: str, device_type: str, cfg: dict, out: str
) -> None:
    torch.set_num_threads(1)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(device_type, local_rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, rank=rank, world_size=world, device_id=device if backend == "nccl" else None
    )
    results: list[dict[str, Any]] = []
    try:
        for op in OPS:
            try:
                for size in sizes(cfg):
                    timing = _time_op(op, size, world, device, cfg)
                    results.append({"op": op, "size_bytes": size, **timing})
            except (NotImplementedError, RuntimeError) as e:  # a collective the backend lacks
                results.append({"op": op, "error": error_line(e)})
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def sweep(
    backend: str, device: str, world: int, cfg: dict, out_dir: Path, placement: str = "host"
) -> list[dict[str, Any]]:
    """One setup's rows: every collective and size, timed by `world` ranks started as a
    training run's are (special/ranks.py): by one torchrun agent on this host, by one per
    emulated node, or one per Slurm node of an srun step (`placement`). A failed setup's folder
    (`ranks/<setup>`) keeps the ranks' output and errors."""
    setup = f"{backend}-{device}-{placement}-{world}"
    raw, folder = out_dir / f".{setup}.json", out_dir / "ranks" / setup
    args = {"world": world, "backend": backend, "device_type": device, "cfg": cfg,
            "out": str(raw), "reports": str(folder)}  # fmt: skip
    nodes = 1 if placement == "host" else 2
    try:
        ranks.run(
            __name__,
            [json.dumps(args)],
            name=f"collectives.{setup}",
            folder=folder,
            nodes=nodes,
            nproc_per_node=world // nodes,
            srun=placement == "slurm",
        )
    except ranks.RanksFailed as e:
        raise ranks.RanksFailed(
            f"the {backend} sweep on {device} tensors ({PLACEMENTS[placement]}): {e}"
        ) from None
    rows: list[dict[str, Any]] = []
    for r in json.loads(raw.read_text()):
        if "error" in r:
            reason = f"{backend} can't run it on {device} tensors: {r['error']}"
            rows.append(
                {
                    "backend": backend,
                    "device": device,
                    "placement": placement,
                    "op": r["op"],
                    "processes": world,
                    "status": "skipped",
                    "reason": reason,
                }
            )
            continue
        algbw = r["size_bytes"] / r["seconds"] / 1e9
        rows.append(
            {
                "backend": backend,
                "device": device,
                "placement": placement,
                "op": r["op"],
                "processes": world,
                "size_bytes": r["size_bytes"],
                "status": "ok",
                "reason": None,
                "latency_us": 1e6 * r["seconds"],
                "latency_low_us": None if r["low"] is None else 1e6 * r["low"],
                "latency_high_us": None if r["high"] is None else 1e6 * r["high"],
                "calls": r["calls"],
                "algbw_gb_s": algbw,
                "busbw_gb_s": algbw * BUS_FACTOR[r["op"]](world),
            }
        )
    raw.unlink()
    return rows


def unavailable(backend: str, device: str, world: int, placement: str = "host") -> str | None:
    """Why this host can't run a setup, or None."""
    if placement != "host" and world % 2:
        return f"{world} processes don't split evenly over 2 nodes"
    if placement == "slurm":
        return no_slurm_nodes()
    if device == "cuda" and torch.cuda.device_count() < world:
        return f"needs {world} CUDA GPUs, this host has {torch.cuda.device_count()}"
    if backend == "nccl" and not dist.is_nccl_available():
        return "this torch has no NCCL"
    return None


def no_slurm_nodes() -> str | None:
    """Why no srun step can span 2 nodes from here, or None. Inside a Slurm job the step runs
    in the job's allocation, which must hold 2 nodes (the Slurm profile asks for them:
    rules/special_studies.smk); elsewhere srun asks the cluster for them."""
    if shutil.which("srun") is None:
        return "no Slurm cluster here (srun not found)"
    if job_id := os.environ.get("SLURM_JOB_ID"):
        try:
            job = SlurmJob.current()
        except SlurmError as e:
            return f"can't tell the nodes of Slurm job {job_id}: {e}"
        if job is not None and len(job.nodes) < 2:
            return (
                f"Slurm job {job_id} has {len(job.nodes)} node ({', '.join(job.nodes)}), its "
                "srun steps can't span 2: submit the study with 2 nodes (profiles/slurm does)"
            )
        return None
    try:
        out = subprocess.run(
            ["sinfo", "--noheader", "--format", "%D"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"Slurm does not answer (sinfo: {e})"
    nodes = sum(int(n) for n in out.split() if n.isdigit())
    return None if nodes >= 2 else f"the Slurm cluster has {nodes} node(s), 2 are needed"


def _figure(rows: list[dict[str, Any]], gradient_bytes: int):
    fig = new_figure(11, 3.6)
    axes = fig.subplots(1, len(OPS), sharey=True)
    ok = [r for r in rows if r["status"] == "ok"]
    setups = list(dict.fromkeys((r["backend"], r["device"], r["placement"]) for r in ok))
    counts = sorted({r["processes"] for r in ok})
    for ax, op in zip(axes, OPS, strict=True):
        for (i, setup), (j, n) in itertools.product(enumerate(setups), enumerate(counts)):
            mine = sorted(
                (
                    r
                    for r in ok
                    if (r["backend"], r["device"], r["placement"]) == setup
                    and r["processes"] == n
                    and r["op"] == op
                ),
                key=lambda r: r["size_bytes"],
            )
            if not mine:
                continue
            where = "" if setup[2] == "host" else f", {PLACEMENTS[setup[2]]}"
            label = f"{setup[0]}, {setup[1]}, {n} processes{where}"
            ax.plot(
                [r["size_bytes"] for r in mine],
                [r["busbw_gb_s"] for r in mine],
                marker="o",
                markersize=3,
                color=f"C{i}",
                label=label,
                linestyle=("-", "--", ":", "-.")[j % 4],
            )
        for x, what in ((gradient_bytes, "CNN gradient"), (DDP_BUCKET_BYTES, "DDP bucket")):
            ax.axvline(x, color="grey", linestyle=":", linewidth=1)
            ax.text(
                x,
                0.98,
                what,
                rotation=90,
                ha="right",
                va="top",
                fontsize=7,
                transform=ax.get_xaxis_transform(),
            )
        ax.set(xscale="log", yscale="log", title=op.replace("_", "-"), xlabel="message (bytes)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("bus bandwidth (GB/s)")
    if setups:
        axes[0].legend(fontsize=7)
    return fig


def run(cfg: dict[str, Any], out_dir: Path, **_: Any) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for world, setup in itertools.product(cfg["processes"], cfg["setups"]):
        backend, device, placement = (setup + "-host").split("-")[:3]
        reason = unavailable(backend, device, world, placement)
        if reason is not None:
            rows.append(
                {
                    "backend": backend,
                    "device": device,
                    "placement": placement,
                    "op": "all",
                    "processes": world,
                    "status": "skipped",
                    "reason": reason,
                }
            )
            continue
        log.info(
            "sweeping %s on %s tensors, %d processes, %s",
            backend,
            device,
            world,
            PLACEMENTS[placement],
        )
        try:
            rows += sweep(backend, device, world, cfg, out_dir, placement)
        except ranks.RanksFailed as e:  # the other setups' rows are kept
            log.error("%s", e)
            rows.append(
                {
                    "backend": backend,
                    "device": device,
                    "placement": placement,
                    "op": "all",
                    "processes": world,
                    "status": "failed",
                    "reason": str(e),
                }
            )
    model = course_gradient(cfg)
    gradient = model["bytes"]
    write_csv(out_dir / "collectives.csv", rows, COLUMNS)
    save_figure(_figure(rows, gradient), out_dir / "bandwidth.png")
    return {
        "rows": rows,
        "course_gradient_bytes": gradient,
        "gradient_model": {k: model[k] for k in ("parameters", "dataset")},
        "ddp_bucket_bytes": DDP_BUCKET_BYTES,
    }


if __name__ == "__main__":
    _worker(**json.loads(sys.argv[1]))
