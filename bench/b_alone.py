"""B2's and B3's one-process pairs, run one job at a time on an otherwise idle host: whether the
differences the DAG measured beside other jobs belong to the launcher and the precision.

    python3 bench/b_alone.py [--rounds 3] [--out b_alone.json]

On the 1-GPU grader folder (bench/grader_1gpu.yaml, `isolation: devices`: jobs side by side,
each on 4 cores of its own), accelerate's n1xp1 stepped 1.40x (1.05-1.87x) torchrun's, and
B3's fp16 1.35x fp32 though accelerate's fp16 on a CPU trains in fp32 (the precision probe
measured fp32). Here each job is the DAG's own (dmls.supervisor.supervise.run: the real
launcher, B's settings from config/config.yaml, 3 seeds, the synthetic tabular set), alone on
the host, the five jobs interleaved round by round so that a drift of the host hits them alike.
Per job and seed: samples/s over the steady epochs; per pair: the ratio of the means over every
seed of every round, with Welch's 95% interval (dmls/stats.py), and the verdict by the one rule.

Then the causes, each in a minimal repro on B's MLP (Linear(512,32)-BatchNorm1d-ReLU-
Linear(32,20), batch 32, Adam, one thread, in this process): a step of the bare model against
the same model inside DDP at world size 1 (gloo), which is what torchrun's code trains at 1 x 1
and accelerate does not; and a step in fp32 against bf16 autocast, with the share of the bf16
step's CPU time that casting takes (aten::_to_copy and aten::copy_, torch.profiler).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))

from dmls import record, stats  # noqa: E402
from dmls.config.spec import resolve_runs  # noqa: E402
from dmls.data import datasets  # noqa: E402
from dmls.supervisor import supervise  # noqa: E402
from dmls.supervisor.hardware import describe  # noqa: E402

JOBS = {
    "torchrun n1xp1": ("cluster_torchrun", "n1xp1"),
    "accelerate n1xp1": ("cluster_accelerate", "n1xp1"),
    "accelerate fp32": ("cluster_precision", "fp32_n1xp1"),
    "accelerate fp16": ("cluster_precision", "fp16_n1xp1"),
    "accelerate bf16": ("cluster_precision", "bf16_n1xp1"),
}
PAIRS = [
    ("accelerate n1xp1", "torchrun n1xp1", "B2: accelerate launch against torchrun, 1 x 1"),
    ("accelerate fp16", "accelerate fp32", "B3: fp16 against fp32, 1 x 1"),
    ("accelerate bf16", "accelerate fp32", "B3: bf16 against fp32, 1 x 1"),
]


def specs() -> tuple[dict[str, Any], dict[str, Any]]:
    """The five runs' specs as the DAG resolves them from config/config.yaml, and its config."""
    from snakemake.utils import validate

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    wanted = {study for study, _ in JOBS.values()}
    config["studies"] = {k: v for k, v in config["studies"].items() if k in wanted}
    validate(config, str(ROOT / "config" / "schemas" / "config.schema.yaml"))
    runs = resolve_runs(config)
    return {name: runs[f"{study}/{run}"] for name, (study, run) in JOBS.items()}, config


# The profiler's ops, grouped as the bf16 cause is read: the matrix products, the casts.
GROUPS = {"matmul": ("aten::mm", "aten::addmm"), "casts": ("aten::_to_copy", "aten::copy_")}


def mlp() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 20))


def step_ms(model: Any, autocast: Any = None, steps: int = 300, profile: bool = False) -> Any:
    """Mean milliseconds of a training step of `model` on random batches of 32 (after 30
    warm-up steps); with `profile`, the self CPU milliseconds per step of each of `GROUPS`
    and the rest instead (torch.profiler over 100 steps)."""
    import contextlib
    import time

    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    x, y = torch.randn(32 * 64, 512), torch.randint(0, 20, (32 * 64,))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i: int) -> None:
        k = i % 64
        opt.zero_grad()
        with autocast() if autocast else contextlib.nullcontext():
            loss = loss_fn(model(x[k * 32 : (k + 1) * 32]), y[k * 32 : (k + 1) * 32])
        loss.backward()
        opt.step()

    for i in range(30):
        step(i)
    if profile:
        with profiler(activities=[ProfilerActivity.CPU]) as p:
            for i in range(100):
                step(i)
        split = dict.fromkeys(("matmul", "casts", "other"), 0.0)
        for e in p.key_averages():
            group = next((g for g, ops in GROUPS.items() if e.key in ops), "other")
            split[group] += e.self_cpu_time_total / 100 / 1e3  # ms per step
        return split
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    return (time.perf_counter() - start) / steps * 1e3


def repro(repeats: int = 5) -> dict[str, Any]:
    """The two causes, measured `repeats` times each, alternating (one thread)."""
    import os

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29581")
    dist.init_process_group("gloo", rank=0, world_size=1)
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    times: dict[str, list[float]] = {"bare": [], "ddp_world_1": [], "fp32": [], "bf16": []}
    for _ in range(repeats):
        times["bare"].append(step_ms(mlp()))
        times["ddp_world_1"].append(step_ms(torch.nn.parallel.DistributedDataParallel(mlp())))
        times["fp32"].append(step_ms(mlp()))
        times["bf16"].append(step_ms(mlp(), bf16))
    dist.destroy_process_group()
    ddp = stats.ratio(times["ddp_world_1"], times["bare"])  # time over time: > 1 is slower
    cast = stats.ratio(times["bf16"], times["fp32"])
    out = {
        "step_ms": times,
        "ddp_over_bare": [ddp.value, ddp.low, ddp.high],
        "bf16_over_fp32": [cast.value, cast.low, cast.high],
        "fp32_split_ms": step_ms(mlp(), profile=True),
        "bf16_split_ms": step_ms(mlp(), bf16, profile=True),
    }
    split = {k: (out["fp32_split_ms"][k], out["bf16_split_ms"][k]) for k in GROUPS}
    print(
        f"step of B's MLP: bare {statistics.fmean(times['bare']):.3f} ms, inside DDP at world "
        f"size 1 {statistics.fmean(times['ddp_world_1']):.3f} ms ({ddp.value:.2f}x the time, "
        f"{ddp.low:.2f}-{ddp.high:.2f}); fp32 {statistics.fmean(times['fp32']):.3f} ms, bf16 "
        f"autocast {statistics.fmean(times['bf16']):.3f} ms ({cast.value:.2f}x, "
        f"{cast.low:.2f}-{cast.high:.2f}); per step, fp32 vs bf16: "
        + ", ".join(f"{k} {a:.3f} vs {b:.3f} ms" for k, (a, b) in split.items())
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4, help="cores per process (the DAG's)")
    parser.add_argument("--out", type=Path, default=Path("b_alone.json"))
    args = parser.parse_args(argv)
    by_name, config = specs()
    work = Path(tempfile.mkdtemp(prefix="b_alone"))
    datasets.prepare("tabular", config["data"]["tabular"], work / "data")
    seeds: dict[str, list[float]] = {name: [] for name in JOBS}
    precision: dict[str, str] = {}
    for round_ in range(args.rounds):
        for name, spec in by_name.items():
            run_dir = work / f"{spec.study}-{spec.run}-{round_}"
            run_dir.mkdir()
            with open(run_dir / "train.log", "w") as log:
                metrics = supervise.run(
                    spec,
                    run_dir=run_dir,
                    data_dir=work / "data",
                    log=log,
                    isolation="none",
                    checkpoint_path=work / "checkpoints" / f"{spec.study}-{spec.run}.pt",
                    threads=args.threads * spec.cpu_shares,
                )
            if metrics["status"] != "ok":
                raise RuntimeError(f"{name} ended {metrics['status']}: {metrics['reason']}")
            values = record.counted_values(metrics, "samples_per_s")
            seeds[name] += values
            precision[name] = metrics["effective_precision"]
            print(
                f"round {round_ + 1}/{args.rounds} {name}: "
                + ", ".join(f"{v:,.0f}" for v in values)
                + " samples/s",
                flush=True,
            )
    pairs = []
    for a, b, what in PAIRS:
        ratio = stats.ratio(seeds[a], seeds[b])
        pairs.append(
            {
                "pair": what,
                "ratio": ratio.value,
                "low": ratio.low,
                "high": ratio.high,
                "verdict": stats.verdict(ratio, "faster", "slower", "seed"),
                "precision": [precision[a], precision[b]],
                "means": [stats.mean_interval(seeds[a]).mean, stats.mean_interval(seeds[b]).mean],
            }
        )
        print(
            f"{what}: {ratio.value:.3f}x ({ratio.low:.3f}-{ratio.high:.3f}), "
            f"{pairs[-1]['verdict']}; computed in {precision[a]} vs {precision[b]}"
        )
    result = {"host": describe(), "threads_per_process": args.threads, "rounds": args.rounds,
              "seeds": seeds, "pairs": pairs, "causes": repro()}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
