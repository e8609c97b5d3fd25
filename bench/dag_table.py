"""Where a whole DAG's time went: one line per training run and special study, slowest first.

    python bench/dag_table.py RESULTS_DIR [--wall SECONDS] [--json FILE]

For each run: its status, how its step ran, the GPUs and cores it held, the whole job's seconds
(Snakemake's benchmark: the supervisor's start and end included) and the launcher's seconds as
the supervisor timed them, split into the launcher's share (torchrun's agent, rendezvous,
spawning and reaping the ranks), rank 0's imports, setup (pg_s of it: joining the process
group, NCCL's init included; then data, model, optimizer), training, evaluation, checkpoints and
teardown (gathering results, saving the model, leaving the group). Then the totals: the jobs'
sum against the DAG's wall time says how much ran side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd


def run_rows(results: Path) -> list[dict]:
    rows = []
    for path in sorted(results.glob("runs/*/*/metrics.json")):
        m = json.loads(path.read_text())
        timing, launch = m.get("timing") or {}, m.get("launch") or {}
        seconds = launch.get("seconds")
        inside = (timing.get("import_s") or 0) + (timing.get("wall_time_s") or 0)
        reserved = m.get("reserved") or {}
        benchmark = results / "benchmarks/train" / m["study"] / f"{m['run']}.tsv"
        job = pd.read_csv(benchmark, sep="\t")["s"].iloc[0] if benchmark.exists() else None
        rows.append(
            {
                "job": f"{m['study']}/{m['run']}",
                "status": m["status"],
                "step": (m.get("step") or {}).get("mode", ""),
                "gpus": len(reserved.get("gpus", [])),
                "cores": len(reserved.get("cores", [])),
                "waited_s": reserved.get("waited_s"),
                # The whole job (Snakemake's benchmark) and the part from starting the launcher
                # to its exit; the difference is the supervisor's (imports, probing the host).
                "job_s": job,
                "seconds": seconds,
                # The launcher's own share: starting (torchrun's agent, rendezvous, spawning
                # the ranks) and ending, around what rank 0 timed itself.
                "launcher_s": seconds - inside if seconds and inside else None,
                "import_s": timing.get("import_s"),
                "setup_s": timing.get("setup_s"),
                "pg_s": timing.get("process_group_s"),
                "train_s": timing.get("train_time_s"),
                "eval_s": timing.get("eval_time_s"),
                "ckpt_s": timing.get("checkpoint_time_s"),
                "teardown_s": timing.get("teardown_s"),
                "epochs": len(m.get("history") or []),
            }
        )
    for path in sorted(results.glob("studies/*/summary.json")):
        s = json.loads(path.read_text())
        rows.append(
            {"job": f"study {s['study']}", "status": s["status"], "seconds": s["wall_time_s"]}
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--wall", type=float, help="the DAG's wall time, in seconds")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = run_rows(args.results)
    if not rows:
        print(f"no metrics.json or summary.json under {args.results}", file=sys.stderr)
        return 1
    table = pd.DataFrame(rows).sort_values("seconds", ascending=False, na_position="last")
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    # A job's own time where Snakemake's benchmark has it (runs), else the study's.
    seconds = table["job_s"].fillna(table["seconds"]) if "job_s" in table else table["seconds"]
    total = seconds.sum()
    two_gpu = seconds[table["gpus"] >= 2].sum() if "gpus" in table else 0
    print(
        f"\n{len(table)} jobs; their seconds add up to {total:.0f} s; runs holding 2+ GPUs "
        f"(one at a time on a 2-GPU host) {two_gpu:.0f} s"
        + (f"; DAG wall {args.wall:.0f} s" if args.wall else "")
    )
    if args.json:
        args.json.write_text(table.to_json(orient="records", indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
