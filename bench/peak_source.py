"""What sets a run's peak allocated GPU memory, and what a step adds, against the batch size: A6's
runs as the example's config trains them (the course CNN, Fashion-MNIST's first 10,000 images,
CUDA-graph steps), one process on one GPU, one seed of one epoch per batch size, each in a
process of its own. The caching allocator's history is recorded (torch.cuda.memory's
`_record_memory_history`), the moment allocated bytes peaked is found by replaying it, and the
blocks alive then are summed by the first frame of this project's code that allocated them.

    python3 bench/peak_source.py [--batches 16 32 64 128] [--data .gpudata] [--out OUT_DIR]

Prints a table per batch size: the record's peak, what the steady steps added (StepMemory),
CUDA graphs' pools, and the peak's live bytes by where they were allocated. Needs a CUDA GPU and
Fashion-MNIST's IDX files (`--data`, as bench/dag_speed.sh's config reads them).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))

MIB = 2**20


def where(frames: list[dict]) -> str:
    """The first frame of this project's code (its file and function), else the allocator's
    innermost Python frame."""
    for frame in frames:
        if "/dmls/" in frame["filename"]:
            return f"{frame['filename'].split('/dmls/')[1]}:{frame['name']}"
    python = [f for f in frames if f["filename"].endswith(".py")]
    return f"{Path(python[0]['filename']).name}:{python[0]['name']}" if python else "(C++)"


def peak_blocks(trace: list[dict]) -> tuple[int, Counter]:
    """Replay one device's allocator trace: the most bytes allocated at once, and the blocks
    alive at that moment summed by `where` they were allocated."""
    live, allocated, most, at = {}, 0, -1, 0
    for k, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = event
            allocated += event["size"]
            if allocated > most:
                most, at = allocated, k
        elif event["action"] == "free_completed" and event["addr"] in live:
            allocated -= live.pop(event["addr"])["size"]
    live = {}
    for event in trace[: at + 1]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
        elif event["action"] == "free_completed":
            live.pop(event["addr"], None)
    by = Counter()
    for event in live.values():
        by[where(event.get("frames") or [])] += event["size"]
    return most, by


def example_run(run: str):
    """A6's `run` as the example's config resolves it (config/config.yaml under
    docs/example-report/config.yaml), on one process of one GPU, one seed of one epoch."""
    import yaml

    from dmls.config.spec import RunSpec, deep_merge, load_schema, resolve_runs, run_defaults

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    example = yaml.safe_load((ROOT / "docs" / "example-report" / "config.yaml").read_text())
    config = deep_merge(config, example)
    # The schema's run defaults under the config's (the lent hosts have no Snakemake to
    # validate with; a run's keys are all the engine reads).
    config["defaults"] = deep_merge(run_defaults(load_schema()), config["defaults"])
    spec = resolve_runs(config)[f"batch_size/{run}"].to_dict()
    return RunSpec.from_dict(
        spec | {"launcher": "single", "nproc_per_node": 1, "epochs": 1, "seeds": 1}
    )


def one(batch: int, data: Path, out: Path) -> dict:
    """Train A6's run at `batch` on one GPU with the allocator's history on (in this process)."""
    import torch

    from dmls import record
    from dmls.data import datasets
    from dmls.training import job

    prepared = out / "data"
    if not (prepared / "fashion_mnist.json").exists():
        datasets.prepare("fashion_mnist", {"debian_dir": str(data), "download": False}, prepared)
    spec = example_run(f"b{batch}")
    torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    run_dir = out / f"b{batch}"
    run_dir.mkdir(parents=True, exist_ok=True)
    seed = record.combine(job.train(spec, prepared, run_dir, run_dir / "ckpt.pt"))["seeds"][0]
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    replayed, by = peak_blocks(trace)
    return {
        "batch": batch,
        "step": seed["step"]["mode"],
        "peak": seed["peak_gpu_mem_allocated_bytes"],
        "replayed_peak": replayed,
        "before_step": seed["gpu_mem_before_step_bytes"],
        "step_adds": seed["step_gpu_mem_bytes"],
        "graph_pool": seed["graph_pool_reserved_bytes"],
        "at_peak": by.most_common(6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--data", type=Path, default=ROOT / ".gpudata")
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp()))
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # (a child's batch size)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.data, args.out)))
        return
    rows = []
    for batch in args.batches:  # each in a process of its own: a fresh allocator
        argv = [
            sys.executable,
            __file__,
            "--one",
            str(batch),
            "--data",
            str(args.data),
            "--out",
            str(args.out),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode:
            sys.exit(f"batch {batch} failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("| batch | step | peak MiB | before the step MiB | a step adds MiB | graph pools MiB |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        mib = [r[k] / MIB for k in ("peak", "before_step", "step_adds", "graph_pool")]
        print(f"| {r['batch']} | {r['step']} | " + " | ".join(f"{m:.1f}" for m in mib) + " |")
    for r in rows:
        parts = ", ".join(f"{w} {b / MIB:.1f}" for w, b in r["at_peak"])
        print(
            f"b{r['batch']}: at the peak ({r['replayed_peak'] / MIB:.1f} MiB), MiB by where "
            f"allocated: {parts}"
        )


if __name__ == "__main__":
    main()
