"""How long the CPU preset (config/cpu.yaml) takes on this machine, estimated from a short
real run of its whole DAG: every run trains 1 seed for 1 epoch on --samples images and
evaluates on as many test images, the special studies run as they are, and each run's measured
epoch is scaled to the preset's samples, epochs and seeds (training with its training samples,
evaluation with its test and validation samples; a checkpoint's time does not change).
CIFAR-10 can't be fetched everywhere, so the A studies train on a SYNTHETIC CIFAR-shaped set
of the same size (50,000 + 10,000 images): same shapes, same work.

    python bench/cpu_preset_time.py [--cores 2] [--samples 2000] [--results results/cpu-estimate]
        [--also 4 ...] [--reuse]

Prints the measured DAG wall time, the estimate per study and in all, as hours. The estimate
spreads each run's extra work over --cores as Snakemake packs jobs by their processes; it
assumes the packing is perfect, so a real DAG can take somewhat longer. `--also 4` adds what
the same measurement gives for 4 cores, under the same assumption, and with the measured DAG's
own wall time shrunk in proportion: derived, not measured (each process keeps the speed it had
here). `--reuse` takes the runs and the wall time of an earlier run of this script in
--results instead of running the DAG again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))

from dmls import record as run_record  # noqa: E402
from dmls.config.spec import deep_merge, load_schema, resolve_runs  # noqa: E402


def preset_runs() -> dict:
    """The preset's run specs, as the Snakefile resolves them (defaults filled by the schema)."""
    from snakemake.utils import validate

    config = deep_merge(
        yaml.safe_load((ROOT / "config/config.yaml").read_text()),
        yaml.safe_load((ROOT / "config/cpu.yaml").read_text()),
    )
    validate(config, str(ROOT / "config/schemas/config.schema.yaml"), set_default=True)
    return resolve_runs(config, load_schema())


def extra_seconds(record: dict, full, manifest: dict) -> float:
    """What the preset's run adds over the measured one: its seeds × epochs of training at its
    samples, evaluation at its test and validation sizes, less the epoch measured. `manifest`
    is the prepared data's (its sizes, where the preset takes them all)."""
    seed = record["seeds"][0]
    epoch = seed["history"][0]
    data = record["data"]
    full_train = full.train_samples or manifest["n_train"] - full.validation_samples
    full_eval = (full.test_samples or manifest["n_test"]) + full.validation_samples
    measured_eval = data["n_test"] + (data.get("n_validation") or 0)
    train = epoch["train_time_s"] * full_train / data["n_train"]
    evaluate = epoch["eval_time_s"] * full_eval / measured_eval
    checkpoint = seed["timing"].get("checkpoint_time_s", 0.0)
    measured = epoch["train_time_s"] + epoch["eval_time_s"] + checkpoint
    seed_setup = record["timing"].get("seed_setup_s", 0.0)
    per_epoch = train + evaluate + checkpoint
    return full.seeds * full.epochs * per_epoch + (full.seeds - 1) * seed_setup - measured


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--results", default="results/cpu-estimate")
    ap.add_argument("--also", type=int, nargs="*", default=[], help="more core counts (derived)")
    ap.add_argument("--reuse", action="store_true", help="the runs of an earlier measurement")
    args = ap.parse_args()
    measured_wall = ROOT / args.results / "measured_wall_s.txt"
    if args.reuse:
        wall = float(measured_wall.read_text())
    else:
        wall = measure(args)
        measured_wall.write_text(f"{wall:.1f}\n")
    print(f"measured DAG ({args.samples} samples, 1 epoch, 1 seed): {wall / 60:.1f} min")
    for cores in (args.cores, *args.also):
        extra = extra_by_study(args.results, cores)
        if cores == args.cores:
            for study, seconds in extra.items():
                print(f"  {study:<22} +{seconds / 3600:5.2f} h")
        total = wall * args.cores / cores + sum(extra.values())
        how = "estimated" if cores == args.cores else "derived from the same runs"
        print(f"CPU preset on {cores} cores, {how}: {total / 3600:.1f} h")


def measure(args: argparse.Namespace) -> float:
    """Run the short DAG on --cores; its wall time in seconds."""
    override = Path(args.results) / "estimate.yaml"
    override.parent.mkdir(parents=True, exist_ok=True)
    override.write_text(
        yaml.safe_dump(
            {
                "results_dir": args.results,
                "seeds": 1,
                "defaults": {
                    "dataset": "synthetic_cifar",
                    "epochs": 1,
                    "train_samples": args.samples,
                    "test_samples": args.samples,
                },
                "data": {"synthetic_cifar": {"n_train": 50000, "n_test": 10000, "seed": 0}},
            }
        )
    )
    start = time.perf_counter()
    command = [sys.executable, "-m", "snakemake", "--cores", str(args.cores)]
    subprocess.run(
        [*command, "--configfile", "config/cpu.yaml", str(override)], cwd=ROOT, check=True
    )
    return time.perf_counter() - start


def extra_by_study(results: str, cores: int) -> dict[str, float]:
    """Per study, the seconds the preset's runs add over the measured ones, on `cores`."""
    extra: dict[str, float] = {}
    for run_id, full in preset_runs().items():
        path = ROOT / results / "runs" / run_id / "metrics.json"
        record = run_record.read(path)
        if record["status"] != "ok":  # skipped here, and in the preset: no time
            continue
        manifest = json.loads(
            (ROOT / results / "data" / f"{record['spec']['dataset']}.json").read_text()
        )
        used = min(cores, full.processes)
        added = extra_seconds(record, full, manifest) * used / cores
        extra[full.study] = extra.get(full.study, 0.0) + added
    return extra


if __name__ == "__main__":
    main()
