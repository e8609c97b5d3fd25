"""GPU memory per run of a results folder: the peak allocated, what a training step adds above
what its GPU held as it began, and that (training/results.StepMemory), each the run's number
(dmls/record.py `value`: the mean over a warm process's seeds), and for a batch sweep the line
through the step memory.

    python3 bench/step_memory.py results [--study batch_size]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from dmls import record

MIB = 2**20
COLUMNS = ("gpu_mem_before_step_bytes", "step_gpu_mem_bytes",
           "peak_gpu_mem_allocated_bytes")  # fmt: skip


def rows(results: Path, study: str | None) -> list[dict]:
    out = []
    for path in sorted(results.glob(f"runs/{study or '*'}/*/metrics.json")):
        metrics = record.read(path)
        if metrics["status"] not in record.RAN:
            continue
        spec = metrics["spec"]
        out.append(
            {
                "run": f"{metrics['study']}/{metrics['run']}",
                "batch_size": spec["batch_size"],
                "precision": metrics["effective_precision"],
                "step": metrics["step"]["mode"],
                "seeds": ",".join(
                    str(metrics["seeds"][k]["seed"])
                    for k in record.counted_seeds(metrics, COLUMNS[0])
                ),
            }
            | {c: record.value(metrics, c)[0] for c in COLUMNS}
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--study")
    args = parser.parse_args()
    table = rows(args.results, args.study)
    print("| run | batch | precision | step | seeds | before step MiB | step adds MiB | peak MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in table:
        mib = [f"{r[c] / MIB:.1f}" if r[c] is not None else "" for c in COLUMNS]
        print(
            f"| {r['run']} | {r['batch_size']} | {r['precision']} | {r['step']} | "
            f"{r['seeds']} | " + " | ".join(mib) + " |"
        )
    sweep = [r for r in table if r["run"].startswith("batch_size/") and r[COLUMNS[1]]]
    if len(sweep) >= 3:
        x = np.array([r["batch_size"] for r in sweep], dtype=float)
        y = np.array([r[COLUMNS[1]] / MIB for r in sweep])
        slope, intercept = np.polyfit(x, y, 1)
        r2 = 1 - np.sum((y - (slope * x + intercept)) ** 2) / np.sum((y - y.mean()) ** 2)
        print(
            f"step memory = {slope:.3f} MiB per sample of batch + {intercept:.1f} MiB, "
            f"R² = {r2:.4f}"
        )


if __name__ == "__main__":
    main()
