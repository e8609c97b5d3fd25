"""Run one training run end to end and always leave a `metrics.json` that says what happened.

The supervisor decides whether this host can run the spec (else: `skipped`, with the reason and
how to fix it), starts the launcher command(s), streams their output to the run's log, and turns
the worker's result, or its error, into the run's metrics file. With `strict`, a run that is
skipped or fails raises instead, so Snakemake fails the job.
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from . import launch
from .cluster import SlurmError, SlurmJob
from .hardware import Host, describe, missing_requirement, resolved_device
from .io import read_json, write_json
from .spec import RunSpec

METRICS_VERSION = 1
HISTORY_COLUMNS = (
    "epoch", "train_loss", "train_accuracy", "test_loss", "test_accuracy",
    "train_time_s", "eval_time_s", "lr",
)  # fmt: skip


class RunFailed(RuntimeError):
    """Raised in strict mode for a run that was skipped or failed."""


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def run(
    spec: RunSpec,
    *,
    run_dir: Path,
    data_dir: Path,
    log: IO[str],
    threads: int,
    strict: bool = False,
    exclusive: bool = True,
) -> dict[str, Any]:
    """Run `spec`, write `<run_dir>/metrics.json` and return its content."""
    run_dir.mkdir(parents=True, exist_ok=True)
    # Files a previous attempt may have left; Snakemake only removes the declared output.
    for name in ("worker.json", "history.csv", "model.pt"):
        (run_dir / name).unlink(missing_ok=True)
    for error_file in run_dir.glob("error-rank*.json"):
        error_file.unlink()
    host = Host.probe()
    record: dict[str, Any] = {
        "metrics_version": METRICS_VERSION,
        "study": spec.study,
        "run": spec.run,
        "spec": spec.to_dict(),
        "derived": {
            "processes": spec.processes,
            "replicas": spec.replicas,
            "global_batch_size": spec.global_batch_size,
            "device": resolved_device(spec, host),
            "nodes_emulated": spec.nodes > 1,
        },
        "host": {"hostname": host.hostname, "gpus": list(host.cuda_devices), **describe()},
        "slurm": None,
        "started_at": _now(),
    }
    try:
        slurm = SlurmJob.current()
    except SlurmError as e:
        reason = f"can't tell the nodes of Slurm job {os.environ['SLURM_JOB_ID']}: {e}"
        print(f"FAILED {spec.run_id}: {reason}", file=log, flush=True)
        return _finish(run_dir, record | {"status": "failed", "reason": reason}, strict)
    # Nodes of this Slurm allocation run one agent each; otherwise all are emulated here.
    srun = slurm is not None and slurm.hosts(spec)
    if slurm:
        record["slurm"] = {"job_id": slurm.job_id, "nodes": list(slurm.nodes)}
        record["derived"]["nodes_emulated"] = spec.nodes > 1 and not srun

    nodes_here = 1 if srun else spec.nodes
    reason = missing_requirement(spec, host, nodes_here=nodes_here) or _data_problem(spec, data_dir)
    if reason:
        print(f"SKIPPED {spec.run_id}: {reason}", file=log, flush=True)
        return _finish(run_dir, record | {"status": "skipped", "reason": reason}, strict)

    port = slurm.rendezvous_port if srun else launch.free_port()
    worker_args = ["--spec", spec.to_json(), "--data-dir", str(data_dir), "--run-dir", str(run_dir)]
    commands = launch.build_commands(
        spec, worker_args, device=record["derived"]["device"], port=port, threads=threads,
        srun=srun,
    )  # fmt: skip
    record["launch"] = {
        "commands": [c.argv for c in commands],
        "env": [c.env for c in commands],
        "threads": threads,
        # Whether Snakemake gave this run the host to itself (config `exclusive_runs`).
        "exclusive": exclusive,
        "load_average_before": os.getloadavg(),
    }
    exit_codes, seconds = _start_and_wait(commands, log)
    record["launch"] |= {"exit_codes": exit_codes, "seconds": seconds}

    if any(exit_codes) or not (run_dir / "worker.json").exists():
        reason = _failure_reason(run_dir, exit_codes)
        print(f"FAILED {spec.run_id}: {reason}", file=log, flush=True)
        return _finish(run_dir, record | {"status": "failed", "reason": reason}, strict)

    result = read_json(run_dir / "worker.json")
    (run_dir / "worker.json").unlink()
    _write_history(run_dir / "history.csv", result["history"])
    return _finish(run_dir, record | result, strict)


def _data_problem(spec: RunSpec, data_dir: Path) -> str | None:
    manifest = read_json(data_dir / f"{spec.dataset}.json")
    if manifest["status"] != "ok":
        return f"dataset {spec.dataset} unavailable: {manifest['reason']}"
    return None


def _start_and_wait(commands: list[launch.Command], log: IO[str]) -> tuple[list[int], float]:
    """Start every command (one per emulated node, or one srun) and wait for all; if one fails,
    stop the others rather than let them wait for a peer that is gone."""
    start = time.perf_counter()
    procs = []
    for command in commands:
        print("$ " + " ".join(command.argv), file=log, flush=True)
        procs.append(
            subprocess.Popen(
                command.argv,
                env=os.environ | command.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so it can be stopped whole
            )
        )
    codes: list[int | None] = [None] * len(procs)
    while any(c is None for c in codes):
        for i, proc in enumerate(procs):
            if codes[i] is None:
                codes[i] = proc.poll()
        if any(c not in (None, 0) for c in codes):
            for i, proc in enumerate(procs):
                if codes[i] is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    codes[i] = proc.wait()
        time.sleep(0.2)
    return [int(c) for c in codes], time.perf_counter() - start


def _failure_reason(run_dir: Path, exit_codes: list[int]) -> str:
    errors = sorted(run_dir.glob("error-rank*.json"), key=lambda p: p.stat().st_mtime)
    if errors:
        first = read_json(errors[0])
        return f"rank {first['rank']} raised {first['error']}"
    if any(exit_codes):
        return f"launcher exited with codes {exit_codes} and no rank reported an error (see log)"
    return "every process exited 0 but rank 0 wrote no result (see log)"


def _write_history(path: Path, history: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=HISTORY_COLUMNS)
        writer.writeheader()
        writer.writerows(history)


def _finish(run_dir: Path, record: dict[str, Any], strict: bool) -> dict[str, Any]:
    record["finished_at"] = _now()
    write_json(run_dir / "metrics.json", record)
    if strict and record["status"] in ("skipped", "failed"):
        raise RunFailed(f"{record['study']}/{record['run']} {record['status']}: {record['reason']}")
    return record


def main_from_snakemake(snakemake: Any) -> None:
    """Entry for the `train` rule's `script:`."""
    spec = RunSpec.from_json(snakemake.params.spec)
    run_dir = Path(snakemake.output.metrics).parent
    with open(snakemake.log[0], "w") as log:
        sys.stderr = log
        run(
            spec,
            run_dir=run_dir,
            data_dir=Path(snakemake.input.manifest).parent,
            log=log,
            threads=snakemake.threads,
            strict=snakemake.config["strict"],
            exclusive=snakemake.config["exclusive_runs"],
        )
