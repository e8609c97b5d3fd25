"""Write the costs the DAG's start-of-run estimate scales (config/costs.yaml; the estimate is
dmls/supervisor/estimate.py) from a finished results folder and its Snakemake log.

    python tools/calibrate_costs.py RESULTS_DIR --section cpu|cuda --host TEXT
        [--log SNAKEMAKE_LOG] [--studies RESULTS_DIR] [--costs config/costs.yaml]
        [--job-gap SECONDS]

`--section cpu` is what a host without a GPU reads, `cuda` what a host with one reads: calibrate
each on a host of its kind (runs on a GPU host's CPU, the B studies, are costed there too).

From each training run that finished (its metrics.json, through dmls.record): the whole job's
seconds (Snakemake's benchmark; where the folder has none, the launcher's seconds plus
`--job-gap`, Snakemake's own share), less every seed's fit, is the run's fixed time; a seed's
setup, the first seed's warm-up (its first epoch over a steady one: CUDA graph capture, cuDNN's
autotuning), a steady epoch's training per sample and evaluation per sample (median over the
epochs after the first, or the first where there is one), a checkpoint per epoch. From each
special study's summary.json, its seconds and the settings it ran with, and from each skipped
run its job's seconds (both from `--studies`' folder where given: another DAG on a host of the
kind, whose runs' costs are not wanted). From the log, every other rule's median job seconds
(prepare_data, aggregate_runs, report_study, render_report, build_fused_conv_relu), to the
second; the rules of special studies are timed by their summary.json instead.

Recalibrate on your own host by running the DAG there and this script on its results folder.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from datetime import datetime
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))

from dmls import record as run_record  # noqa: E402
from dmls.summary import read as read_summary  # noqa: E402

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ [\d:]{8} \d{4})\]$")
STARTED = re.compile(r"^(?:local)?rule (\w+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")
STUDY_OUTPUT = re.compile(r"^\s+output: .*/studies/\w+/summary\.json")
# A special study's settings that change nothing it runs (a title; a path the DAG hands it).
UNTIMED_SETTINGS = ("enabled", "title", "collectives_csv")
# Rules whose jobs the estimate times from records (runs, studies), not from the log.
FROM_RECORDS = {"train"}


def three(x: float) -> float:
    """`x` to three significant figures: what a measured cost is worth."""
    return float(f"{x:.3g}")


def run_costs(record: dict, job_s: float) -> dict:
    """A finished run's costs (the module's doc) and what the estimate compares it by."""
    seeds = [s for s in record["seeds"] if s["status"] == "ok"]
    data = record["data"]
    n_train = data["n_train"]
    n_eval = data["n_test"] + (data.get("n_validation") or 0)
    epochs = [h for s in seeds for h in s["history"]]
    steady = [h for s in seeds for h in s["history"][1:]] or epochs
    train = statistics.median(h["train_time_s"] for h in steady)
    evaluate = statistics.median(h["eval_time_s"] for h in steady)
    first_warmup = max(seeds[0]["history"][0]["train_time_s"] - train, 0.0)
    later = [max(s["history"][0]["train_time_s"] - train, 0.0) for s in seeds[1:]]
    seed_s = statistics.median(s["timing"].get("setup_s", 0.0) for s in seeds) + (
        statistics.median(later) if later else 0.0
    )
    checkpoint = sum(s["timing"].get("checkpoint_time_s", 0.0) for s in seeds) / len(epochs)
    fits = sum(s["timing"]["fit_s"] for s in seeds)
    spec = record["spec"]
    return {
        "device": record["derived"]["device"],
        "launcher": spec["launcher"],
        "processes": record["derived"]["processes"],
        "step": spec["step"],
        "loader": spec["loader"],
        "precision": spec["precision"],
        "n_train": n_train,
        "n_test": data["n_test"],
        "fixed_s": three(max(job_s - fits, 0.0)),
        "seed_s": three(seed_s),
        "first_warmup_s": three(first_warmup),
        "train_s_per_sample": three(train / n_train),
        "eval_s_per_sample": three(evaluate / n_eval),
        "checkpoint_s": three(checkpoint),
    }


def shown(path: Path) -> str:
    """`path` as the table names it: within this repository, from its root; else its name."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def job_seconds(results: Path, record: dict, job_gap: float) -> float:
    """The run's whole job: Snakemake's benchmark, else the launcher's seconds + `job_gap`."""
    bench = results / "benchmarks" / "train" / record["study"] / f"{record['run']}.tsv"
    if bench.exists():
        return float(pd.read_csv(bench, sep="\t")["s"].iloc[0])
    return (record.get("launch") or {}).get("seconds", 0.0) + job_gap


def rule_seconds(log: Path) -> tuple[dict[str, float], set[str]]:
    """Each rule's median job seconds in a Snakemake log (its jobs' start and end stamps), and
    the rules that run a special study (their output is a study's summary.json)."""
    started: dict[str, tuple[str, datetime]] = {}
    seconds: dict[str, list[float]] = {}
    studies: set[str] = set()
    stamp = rule = None
    for line in log.read_text().splitlines():
        if m := STAMP.match(line):
            stamp = datetime.strptime(m[1], "%a %b %d %H:%M:%S %Y")
        elif m := STARTED.match(line):
            rule = m[1]
        elif rule and STUDY_OUTPUT.match(line):
            studies.add(rule)
        elif (m := JOBID.match(line)) and rule and stamp:
            started[m[1]] = (rule, stamp)
            rule = None
        elif (m := FINISHED.match(line)) and m[1] in started and stamp:
            name, start = started.pop(m[1])
            seconds.setdefault(name, []).append((stamp - start).total_seconds())
    return {name: three(statistics.median(v)) for name, v in sorted(seconds.items())}, studies


def section(results: Path, studies_dir: Path, log: Path | None, host: str, job_gap: float) -> dict:
    """The cost table's section measured in `results` (the module's doc)."""
    runs, hosts, machines = {}, set(), set()
    skipped = [
        job_seconds(studies_dir, record, job_gap)
        for record in map(run_record.read, sorted(studies_dir.glob("runs/*/*/metrics.json")))
        if record["status"] == "skipped"
    ]
    for path in sorted(results.glob("runs/*/*/metrics.json")):
        record = run_record.read(path)
        if record["status"] == "ok":
            job_s = job_seconds(results, record, job_gap)
            runs[f"{record['study']}/{record['run']}"] = run_costs(record, job_s)
            facts = record.get("host") or {}
            hosts.add(f"{facts.get('torch')}")
            gpus = facts.get("gpus") or []
            machines.add(
                f"{facts.get('cpu_model')}, {facts.get('cpu_count')} CPUs"
                + (f", {len(gpus)}× {gpus[0]}" if gpus else "")
            )
    studies = {}
    for path in sorted(studies_dir.glob("studies/*/summary.json")):
        summary = read_summary(path)
        if summary["status"] == "ok" and summary.get("wall_time_s"):
            settings = {
                k: v for k, v in (summary.get("config") or {}).items() if k not in UNTIMED_SETTINGS
            }
            studies[summary["study"]] = {
                "seconds": three(summary["wall_time_s"]),
                "settings": settings,
            }
    measured, study_rules = rule_seconds(log) if log else ({}, set())
    rules = {k: v for k, v in measured.items() if k not in FROM_RECORDS | study_rules}
    return {
        "measured_on": {
            "host": host,
            "torch": sorted(hosts),
            "machines": sorted(machines),  # as the runs' records name them
            "runs": shown(results),
            "studies": shown(studies_dir),
            "log": shown(log) if log else None,
            "date": datetime.now().strftime("%Y-%m-%d"),
        },
        "skipped_job_s": three(statistics.median(skipped)) if skipped else 0.0,
        "rules": rules,
        "studies": studies,
        "runs": runs,
    }


HEADER = """\
# Measured job costs the DAG's start-of-run estimate scales (dmls/supervisor/estimate.py).
# Written by tools/calibrate_costs.py (its docstring says what each number is); recalibrate on
# your own host with it. `cpu`: read on a host without a GPU; `cuda`: on a host with one.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--section", choices=("cpu", "cuda"), required=True)
    ap.add_argument("--log", type=Path, help="the DAG's Snakemake log (other rules' costs)")
    ap.add_argument(
        "--studies", type=Path, help="the results folder of special studies and skipped runs"
    )
    ap.add_argument("--host", required=True, help="the host, as a reader names it")
    ap.add_argument("--costs", type=Path, default=ROOT / "config" / "costs.yaml")
    ap.add_argument(
        "--job-gap",
        type=float,
        default=0.0,
        help="Snakemake's own seconds per job where no benchmark has them",
    )
    args = ap.parse_args(argv)
    costs = yaml.safe_load(args.costs.read_text()) if args.costs.exists() else {}
    costs[args.section] = section(
        args.results, args.studies or args.results, args.log, args.host, args.job_gap
    )
    args.costs.write_text(
        HEADER + yaml.safe_dump(costs, sort_keys=False, width=100, allow_unicode=True)
    )
    got = costs[args.section]
    print(
        f"{args.costs}: {args.section}: {len(got['runs'])} runs, {len(got['studies'])} "
        f"studies, {len(got['rules'])} other rules"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
