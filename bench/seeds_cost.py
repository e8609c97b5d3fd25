"""What a run's seeds cost: the same A1 run as a 1-seed job and as a 3-seed job (#17's bar: the
3-seed job at most 2.3x the 1-seed job, launch and setup paid once), and whether a later seed,
which trains in a warm process, steps as fast as the first.

    python3 bench/seeds_cost.py [--epochs 5] [--runs single_gpu ddp_2gpu ...] [--out seeds.json]

Each job goes through the DAG's own supervisor (dmls.supervisor.supervise.run: the real
launcher, torchrun for DDP), with A1's settings from config/config.yaml on a synthetic
CIFAR-sized set (50,000 + 10,000 images). Per job: its wall time (the launcher's start to its
end), where the time outside the epochs went (imports, process group, setup, teardown), and
every seed's first and steady epoch (median of epochs 2..E). Fewer epochs than the course's 15
make the bar harder to meet: the launch is a larger share of a shorter job.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from epoch_speed import ROOT, a1_spec, cifar_sized_data

sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from dmls.stats import difference
from dmls.supervisor import supervise

A1 = {
    "single_gpu": {"launcher": "single"},
    "dataparallel_2gpu_persistent": {
        "launcher": "dp", "nproc_per_node": 2, "replica_threads": "persistent"
    },
    "ddp_2gpu": {"launcher": "torchrun", "nproc_per_node": 2},
    # torchrun's path on a host of one GPU (bench/launch_overhead.py --run ddp_1gpu).
    "ddp_1gpu": {"launcher": "torchrun", "nproc_per_node": 1},
}  # fmt: skip


def job(run: str, seeds: int, epochs: int, data_dir: Path, work: Path) -> dict[str, Any]:
    spec = a1_spec(
        f"{run}_s{seeds}", **A1[run], seeds=seeds, epochs=epochs, dataset="synthetic_cifar"
    )
    run_dir = work / spec.run
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "train.log", "w") as log:
        metrics = supervise.run(
            spec,
            run_dir=run_dir,
            data_dir=data_dir,
            log=log,
            isolation="none",
            checkpoint_path=work / "checkpoints" / f"{spec.run}.pt",
            threads=4 * spec.cpu_shares,
        )
    if metrics["status"] != "ok":
        raise RuntimeError(f"{spec.run} ended {metrics['status']}: {metrics['reason']}")
    timing = metrics["timing"]
    wall = metrics["launch"]["seconds"]
    inside = timing["train_time_s"] + timing["eval_time_s"]
    return {
        "run": run,
        "seeds": seeds,
        "epochs": epochs,
        "wall_s": wall,
        "outside_training_s": wall - inside,
        "split_s": {
            k: timing.get(k)
            for k in (
                "import_s",
                "process_group_s",
                "setup_s",
                "seed_setup_s",
                "checkpoint_time_s",
                "teardown_s",
            )
        },
        "launcher_s": wall - timing["import_s"] - timing["wall_time_s"],
        "step": metrics["step"]["mode"] + ("+compile" if metrics["step"]["compiled"] else ""),
        "per_seed": [
            {
                "seed": s["seed"],
                "setup_s": s["timing"]["setup_s"],
                "first_epoch_s": s["timing"]["first_epoch_s"],
                "steady_epoch_s": s["timing"]["steady_epoch_s"],
                "steady_epochs_s": [h["train_time_s"] for h in s["history"][1:]],
                "test_accuracy": s["final"]["test_accuracy"],
            }
            for s in metrics["seeds"]
        ],
    }


def warm_process(three: dict[str, Any]) -> dict[str, Any]:
    """The first seed's steady epochs against the later seeds' (each epoch a sample)."""
    first, *later = three["per_seed"]
    d = difference([t for s in later for t in s["steady_epochs_s"]], first["steady_epochs_s"])
    return {
        "first_seed_steady_s": first["steady_epoch_s"],
        "later_seeds_steady_s": [s["steady_epoch_s"] for s in later],
        "later_minus_first_s": d.value,
        "interval_s": [d.low, d.high],
        "within_noise": d.within_noise,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--runs", nargs="+", default=list(A1), choices=list(A1))
    parser.add_argument("--out", type=Path, default=Path("seeds_cost.json"))
    args = parser.parse_args()
    work = cifar_sized_data("seeds-cost-")
    data_dir = work / "data"
    rows = []
    for run in args.runs:
        one = job(run, 1, args.epochs, data_dir, work)
        three = job(run, 3, args.epochs, data_dir, work)
        row = {
            "run": run,
            "one_seed": one,
            "three_seeds": three,
            "ratio_3_to_1": three["wall_s"] / one["wall_s"],
            "warm_process": warm_process(three),
        }
        rows.append(row)
        print(
            f"{run}: 1 seed {one['wall_s']:.1f} s ({one['outside_training_s']:.1f} s outside "
            f"training and evaluation), 3 seeds {three['wall_s']:.1f} s: "
            f"{row['ratio_3_to_1']:.2f}x; steady epoch seed 0 "
            f"{three['per_seed'][0]['steady_epoch_s']:.3f} s, later "
            f"{[round(s['steady_epoch_s'], 3) for s in three['per_seed'][1:]]}",
            flush=True,
        )
    facts = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    args.out.write_text(json.dumps({"facts": facts, "rows": rows}, indent=1))
    print(
        json.dumps(
            [{k: r[k] for k in ("run", "ratio_3_to_1", "warm_process")} for r in rows], indent=1
        )
    )
    print(
        "steady epochs:",
        {
            r["run"]: statistics.median(s["steady_epoch_s"] for s in r["three_seeds"]["per_seed"])
            for r in rows
        },
    )


if __name__ == "__main__":
    main()
