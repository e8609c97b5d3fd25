"""Where a whole DAG's time went: one line per training run and special study, slowest first.

    python bench/dag_table.py RESULTS_DIR [--wall SECONDS] [--json FILE] [--studies STUDY...]

The rows come from dmls/report/timeline.py, which the report's "DAG timeline" section draws
too. For each run: its status, how its step ran, the GPUs and cores it held, the whole job's seconds
(Snakemake's benchmark: the supervisor's start and end included) and the launcher's seconds as
the supervisor timed them, split into the launcher's share (torchrun's agent, rendezvous,
spawning and reaping the ranks), rank 0's imports, setup (pg_s of it: joining the process
group, NCCL's init included; then data, model, optimizer), training, evaluation, checkpoints and
teardown (gathering results, saving the model, leaving the group). Special studies have the GPUs
and cores they reserved (their summary.json `reserved`; without one, their threads as cores).

Then the totals, and the DAG's wall (`--wall`) against its inherent time: what no scheduler could
beat on this host, the longest job or the GPU-seconds the jobs held over the host's GPUs
(`--gpus`; by default as many as the jobs held between them), whichever is larger.
`--studies` keeps only those studies' jobs (a later sitting that ran them again, with its own
`--wall`).

Where the DAG wrote its start-of-run estimate (logs/estimate.json, dmls/supervisor/estimate.py),
each row has the seconds estimated for it (`est_s`), and the estimated wall is set against
`--wall`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from dmls.report.timeline import from_results

PRINTED = ("job", "status", "step", "gpus", "cores", "waited_s", "job_s", "seconds",
           "launcher_s", "import_s", "setup_s", "pg_s", "train_s", "eval_s", "ckpt_s",
           "teardown_s", "epochs")  # fmt: skip


def estimated(results: Path) -> tuple[dict[str, float], float | None]:
    """The start-of-run estimate in `results` (logs/estimate.json): each job's seconds, named as
    this table names it, and the wall; nothing where the DAG wrote none."""
    path = results / "logs" / "estimate.json"
    if not path.exists():
        return {}, None
    body = json.loads(path.read_text())
    named = {
        (j["job"] if j["rule"] == "train" else f"study {j['job']}"): j["seconds"]
        for j in body["jobs"]
    }
    return named, body["wall_s"]


def job_seconds(table: pd.DataFrame) -> pd.Series:
    """Each job's own time where Snakemake's benchmark has it (runs), else the launcher's or
    the study's."""
    return table["job_s"].fillna(table["seconds"]) if "job_s" in table else table["seconds"]


def inherent(table: pd.DataFrame, gpus: int) -> dict[str, float]:
    """The DAG's inherent time on a host of `gpus` GPUs: the longest job's seconds, or every
    job's GPUs × seconds summed over the host's GPUs, whichever is larger (`job_seconds`)."""
    seconds = job_seconds(table)
    gpu_seconds = float((table["gpus"].fillna(0) * seconds.fillna(0)).sum())
    longest = float(seconds.max())
    per_gpu = gpu_seconds / gpus if gpus else 0.0
    return {
        "longest_s": longest,
        "gpu_seconds": gpu_seconds,
        "gpus": gpus,
        "per_gpu_s": per_gpu,
        "inherent_s": max(longest, per_gpu),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--wall", type=float, help="the DAG's wall time, in seconds")
    parser.add_argument("--gpus", type=int, help="the host's GPUs (default: those the jobs held)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--studies", nargs="+", help="only these studies' jobs")
    args = parser.parse_args(argv)
    found = from_results(args.results)
    if args.studies:
        found = [
            r
            for r in found
            if r["job"].split("/")[0] in args.studies
            or r["job"] in {f"study {s}" for s in args.studies}
        ]
    # (a sitting of some studies has no start-of-DAG estimate of its own)
    guess, guess_wall = estimated(args.results) if not args.studies else ({}, None)
    columns = PRINTED if not guess else (*PRINTED[:7], "est_s", *PRINTED[7:])
    rows = [
        {k: r.get(k) for k in columns} | ({"est_s": guess.get(r["job"])} if guess else {})
        for r in found
    ]
    if not rows:
        print(f"no metrics.json or summary.json under {args.results}", file=sys.stderr)
        return 1
    table = pd.DataFrame(rows).sort_values("seconds", ascending=False, na_position="last")
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    seconds = job_seconds(table)
    total = seconds.sum()
    two_gpu = seconds[table["gpus"] >= 2].sum() if "gpus" in table else 0
    label = "the sitting's wall" if args.studies else "DAG wall"
    wall = f"; {label} {args.wall:.0f} s" if args.wall else ""
    print(
        f"\n{len(table)} jobs; their seconds add up to {total:.0f} s; runs holding 2+ GPUs "
        f"(one at a time on a 2-GPU host) {two_gpu:.0f} s{wall}"
    )
    if not args.studies:  # (the inherent time is the whole DAG's)
        gpus = args.gpus or len({g for r in found for g in r.get("gpu_ids") or []})
        bound = inherent(table, gpus)
        print(
            f"inherent time {bound['inherent_s']:.0f} s: the longest job "
            f"{bound['longest_s']:.0f} s, {bound['gpu_seconds']:.0f} GPU-seconds over {gpus} "
            f"GPUs {bound['per_gpu_s']:.0f} s"
            + (f"; the wall is {args.wall / bound['inherent_s']:.2f}x it" if args.wall else "")
            + ("" if gpus else " (no job reserved a GPU: isolation none, or a CPU host)")
        )
    if guess_wall is not None:
        print(
            f"estimated at the start: {guess_wall:.0f} s"
            + (
                f"; measured {args.wall:.0f} s, {args.wall / guess_wall:.2f}x it"
                if args.wall
                else ""
            )
        )
    if args.json:
        args.json.write_text(table.to_json(orient="records", indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
