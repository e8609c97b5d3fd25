"""Seconds per epoch of the course CNN, the course's way and the fast way, side by side.

    python3 bench/epoch_speed.py [--out speed.json]                   # every GPU comparison
    python3 bench/epoch_speed.py --accuracy-data DIR [--out ...]      # + Fashion-MNIST accuracy
    python3 bench/epoch_speed.py --device cpu --n-train 512 --epochs 1  # the CPU path (CI)

Every row is one training of the pipeline's own engine (dmls.training.job.train, the DAG's
runs), with the A1 settings of config/config.yaml (3-conv CNN, AdamW + OneCycle, random crop
and flip) on a synthetic CIFAR-shaped set (uint8 3×32×32, 50,000 training images: CIFAR-10
itself can't be fetched everywhere, and speed doesn't depend on the pixels). Single-GPU rows
run in this process on GPU 0; the DDP rows start one process per GPU. An epoch's time is the
engine's own `train_time_s` (synchronised before and after); "steady" is the median over the
epochs after the first, which also pays for cuDNN autotuning, CUDA-graph capture and
compilation. The table puts the ratios the targets are stated in first; --out writes JSON.
With --accuracy-data (a folder with Fashion-MNIST's IDX files), the course path and the fast
path also train on real Fashion-MNIST for a few seeds, to show they reach the same accuracy.

The DDP rows start their ranks with torch.multiprocessing.spawn, setting the variables torchrun
sets, not through the supervisor's launcher (dmls/supervisor/launch.py): an epoch's time is
counted inside the ranks, after any launcher's part, so the two give the same epoch; spawn
keeps every row in this one script's run. Jobs through the launcher are bench/seeds_cost.py's
and bench/launch_overhead.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))

import torch  # noqa: E402
import yaml  # noqa: E402

from dmls import record  # noqa: E402
from dmls.config.spec import RunSpec, deep_merge, resolve_runs  # noqa: E402
from dmls.data import datasets  # noqa: E402
from dmls.training import job as trainer  # noqa: E402

COURSE = {"loader": "torch", "step": "eager"}  # DataLoader + per-image transforms, eager steps


def a1_spec(run: str, **overrides: Any) -> RunSpec:
    """The A1 run spec of config/config.yaml with `overrides`, completed from the schema; one
    seed and no validation split unless `overrides` says otherwise (a bench times one
    training)."""
    from snakemake.utils import validate

    with open(ROOT / "config" / "config.yaml") as f:
        defaults = yaml.safe_load(f)["defaults"]
    config = {
        # One seed, no validation split: a bench times training (and its test set's evaluation).
        "defaults": deep_merge(defaults, {"seeds": 1, "validation_samples": 0}, overrides),
        "studies": {"parallelism": {"runs": {run: {}}}},
    }
    validate(config, str(ROOT / "config" / "schemas" / "config.schema.yaml"))
    return resolve_runs(config)[f"parallelism/{run}"]


def cifar_sized_data(prefix: str) -> Path:
    """A new work folder holding a synthetic set of CIFAR-10's size (50,000 + 10,000 images),
    prepared as the DAG prepares it, in `<work>/data`."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    data = {"n_train": 50000, "n_test": 10000, "seed": 0}
    datasets.prepare("synthetic_cifar", data, work / "data")
    return work


def plan(device: str, gpus: int, batch_small: int, batch_large: int) -> list[dict[str, Any]]:
    """The rows: (name, processes, spec overrides)."""
    fast = {"loader": "device"}
    rows = [
        ("course", 1, {**COURSE, "batch_size": batch_small}),
        ("device_eager", 1, {**fast, "step": "eager", "batch_size": batch_small}),
        ("device_graph", 1, {**fast, "step": "graph", "batch_size": batch_small}),
    ]
    if device == "cuda":
        rows += [
            ("device_compile", 1, {**fast, "step": "compile", "batch_size": batch_small}),
            ("course_large", 1, {**COURSE, "batch_size": batch_large}),
            ("device_graph_large", 1, {**fast, "step": "graph", "batch_size": batch_large}),
            ("device_compile_large", 1, {**fast, "step": "compile", "batch_size": batch_large}),
        ]
        if gpus >= 2:
            ddp = {"launcher": "torchrun", "nproc_per_node": 2, "backend": "nccl"}
            rows += [
                ("ddp2_graph_large", 2, {**fast, **ddp, "batch_size": batch_large}),
                (
                    "ddp2_compile_large",
                    2,
                    {**fast, **ddp, "step": "compile", "batch_size": batch_large},
                ),
            ]
    return [{"name": n, "processes": p, "overrides": o} for n, p, o in rows]


def train_once(spec: RunSpec, data_dir: Path, work: Path) -> dict[str, Any]:
    run_dir = work / spec.run
    run_dir.mkdir(parents=True, exist_ok=True)
    result = trainer.train(spec, data_dir, run_dir, run_dir / "checkpoint.pt")
    assert result is not None  # rank 0
    return first_seed(result)


def first_seed(result: dict[str, Any]) -> dict[str, Any]:
    """The job's first seed's result, with how the job ended (record.combine: as the
    supervisor records it)."""
    combined = record.combine(result)
    return result["seeds"][0] | {"status": combined["status"], "reason": combined["reason"]}


def _ddp_worker(rank: int, world: int, port: int, spec_json: str, data_dir: str, out: str):
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    spec = RunSpec.from_json(spec_json)
    run_dir = Path(out) / spec.run
    run_dir.mkdir(parents=True, exist_ok=True)
    result = trainer.train(spec, Path(data_dir), run_dir, run_dir / "checkpoint.pt")
    if result is not None:
        (run_dir / "result.json").write_text(json.dumps(result))
    # As workflow/scripts/rank.py does: skip interpreter shutdown, where leftover
    # process-group threads hung these NCCL ranks (2× H100, torch 2.11) or aborted gloo ones.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train_ddp(spec: RunSpec, data_dir: Path, work: Path) -> dict[str, Any]:
    """One process per GPU, as torchrun would start them (the engine reads the same variables)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(
        _ddp_worker,
        args=(spec.processes, port, spec.to_json(), str(data_dir), str(work)),
        nprocs=spec.processes,
    )
    return first_seed(json.loads((work / spec.run / "result.json").read_text()))


def measure(row: dict[str, Any], base: dict[str, Any], data_dir: Path, work: Path) -> dict:
    spec = a1_spec(row["name"], **deep_merge(base, row["overrides"]))
    print(f"-- {row['name']}: {row['overrides']}", file=sys.stderr, flush=True)
    result = (train_ddp if row["processes"] > 1 else train_once)(spec, data_dir, work)
    if result["status"] != "ok":
        raise RuntimeError(f"{row['name']} ended {result['status']}: {result['reason']}")
    epochs = [h["train_time_s"] for h in result["history"]]
    return {
        "name": row["name"],
        "gpus": row["processes"] if spec.device == "cuda" else 0,
        "batch_per_process": spec.batch_size,
        "loader": spec.loader,
        "step": result["step"]["mode"] + ("+compile" if result["step"]["compiled"] else ""),
        "eager_reason": result["step"]["eager_reason"],
        "n_train": result["data"]["n_train"],
        "first_epoch_s": epochs[0],
        "steady_epoch_s": statistics.median(epochs[1:]) if len(epochs) > 1 else epochs[0],
        "test_accuracy": result["final"]["test_accuracy"],
    }


def ratios(rows: dict[str, dict]) -> list[tuple[str, float, str]]:
    """(claim, value, target) for each target the issue states, where both rows ran."""

    def speedup(slow: str, fast: str) -> float | None:
        if slow in rows and fast in rows:
            return rows[slow]["steady_epoch_s"] / rows[fast]["steady_epoch_s"]
        return None

    out = []
    best_small = min(
        (
            r
            for r in rows.values()
            if r["gpus"] <= 1
            and r["name"].startswith("device_")
            and not r["name"].endswith("_large")
        ),
        key=lambda r: r["steady_epoch_s"],
        default=None,
    )
    if best_small and "course" in rows:
        out.append(
            (
                f"{best_small['name']} vs course, batch {best_small['batch_per_process']}",
                speedup("course", best_small["name"]),
                "≥ 10×",
            )
        )
        out.append((f"{best_small['name']} s/epoch", best_small["steady_epoch_s"], "≤ 0.6 s"))
    for step in ("graph", "compile"):
        value = speedup(f"device_{step}_large", f"ddp2_{step}_large")
        if value is not None:
            out.append((f"DDP 2 GPUs vs 1 GPU ({step}), batch 128/GPU", value, "≥ 1.8×"))
    return out


def print_table(rows: list[dict], claims: list[tuple[str, float, str]], host: str) -> None:
    print(f"\n{host}")
    for claim, value, target in claims:
        unit = " s" if "s/epoch" in claim else "×"
        print(f"  {claim:<48} {value:8.2f}{unit}   target {target}")
    course = {r["batch_per_process"]: r for r in rows if r["loader"] == "torch" and r["gpus"] <= 1}
    header = ("run", "GPUs", "batch", "loader", "step", "1st s", "s/epoch", "vs course", "test acc")
    print("\n" + "  ".join(f"{h:>10}" if i else f"{h:<22}" for i, h in enumerate(header)))
    for r in rows:
        ref = course.get(r["batch_per_process"])
        vs = f"{ref['steady_epoch_s'] / r['steady_epoch_s']:.2f}×" if ref else "-"
        cells = (
            r["name"],
            r["gpus"],
            r["batch_per_process"],
            r["loader"],
            r["step"],
            f"{r['first_epoch_s']:.3f}",
            f"{r['steady_epoch_s']:.3f}",
            vs,
            f"{r['test_accuracy']:.4f}",
        )
        print("  ".join(f"{c:>10}" if i else f"{c:<22}" for i, c in enumerate(cells)))


def accuracy_check(data_dir: Path, work: Path, device: str, seeds: int, epochs: int) -> dict:
    """Course path vs fast path on real Fashion-MNIST: test accuracy over `seeds` seeds."""
    out: dict[str, Any] = {}
    for name, path in (("course", COURSE), ("fast", {"loader": "device", "step": "graph"})):
        accs = []
        for seed in range(seeds):
            spec = a1_spec(
                f"fmnist_{name}_{seed}",
                dataset="fashion_mnist",
                device=device,
                epochs=epochs,
                seed=seed,
                batch_size=128,
                **path,
            )
            print(f"-- accuracy {name} seed {seed}", file=sys.stderr, flush=True)
            accs.append(train_once(spec, data_dir, work)["final"]["test_accuracy"])
        out[name] = {"test_accuracy": accs, "mean": statistics.mean(accs),
                     "std": statistics.stdev(accs) if len(accs) > 1 else 0.0}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--n-train", type=int, default=50_000)
    parser.add_argument("--n-test", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="the small batch (course: 32)")
    parser.add_argument("--batch-large", type=int, default=128)
    parser.add_argument("--accuracy-data", type=Path, help="folder with Fashion-MNIST IDX files")
    parser.add_argument("--accuracy-seeds", type=int, default=3)
    parser.add_argument("--accuracy-epochs", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the rows and ratios here as JSON")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda, but CUDA is not available here (use --device cpu)")

    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    where = f"{gpus}× {torch.cuda.get_device_name(0)}" if gpus else "CPU"
    host = (
        f"{socket.gethostname()}: {where}, torch {torch.__version__}, "
        f"synthetic CIFAR-shaped data ({args.n_train} train images)"
    )
    base = {
        "dataset": "synthetic_cifar",
        "device": args.device,
        "epochs": args.epochs,
        "num_workers": min(4, os.cpu_count() or 1),
    }
    if args.device == "cpu":
        base |= {"backend": "gloo", "model": {"conv_channels": [8, 16], "fc_hidden": 32}}
    with tempfile.TemporaryDirectory(prefix="dmls-bench-") as tmp:
        work = Path(tmp)
        datasets.prepare(
            "synthetic_cifar", {"n_train": args.n_train, "n_test": args.n_test, "seed": 0}, work
        )
        rows = [
            measure(row, base, work, work)
            for row in plan(args.device, gpus, args.batch, args.batch_large)
        ]
        by_name = {r["name"]: r for r in rows}
        claims = ratios(by_name)
        report: dict[str, Any] = {
            "host": host,
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if gpus else None,
            "data": "synthetic CIFAR-shaped (uint8 3x32x32)",
            "rows": rows,
            "ratios": [{"claim": c, "value": v, "target": t} for c, v, t in claims],
        }
        print_table(rows, claims, host)
        save(report, args.out)  # the speed table survives a slow accuracy check
        if args.accuracy_data:
            datasets.prepare(
                "fashion_mnist",
                {"debian_dir": str(args.accuracy_data), "download": False},
                work,
                strict=True,
            )
            accuracy = accuracy_check(
                work, work, args.device, args.accuracy_seeds, args.accuracy_epochs
            )
            for name, acc in accuracy.items():
                print(
                    f"Fashion-MNIST {name}: test accuracy {acc['mean']:.4f} ± {acc['std']:.4f} "
                    f"({', '.join(f'{a:.4f}' for a in acc['test_accuracy'])})"
                )
            save(report | {"fashion_mnist_accuracy": accuracy}, args.out)


def save(report: dict[str, Any], path: Path | None) -> None:
    if path:
        path.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
