"""Run one training run end to end and always leave a `metrics.json` that says what happened.

The supervisor decides whether this host can run the spec (else: `skipped`, with the reason and
how to fix it), starts the launcher command(s), streams their output to the run's log, and turns
the worker's result, or its error, into the run's metrics file. With `strict`, a run that is
skipped or fails raises instead, so Snakemake fails the job.

A launcher killed from outside (`kill -9`, a preemption), or a Slurm step srun could not start
on a node (the node lost as the job started), is no result: the job fails without a metrics
file, and the retry or rerun resumes from the run's checkpoint (dmls/training/checkpoint.py).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import os
import signal
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, cast

from filelock import FileLock, Timeout

from dmls import bytecode, joblog, protocol
from dmls import record as run_record
from dmls.config.spec import RunSpec
from dmls.files import read_json
from dmls.joblog import job_log
from dmls.protocol import Fault
from dmls.supervisor import launch, processes, slots
from dmls.supervisor.hardware import (
    Host,
    describe,
    gpus_needed,
    host_facts,
    missing_requirement,
    resolved_device,
)
from dmls.supervisor.slurm import SlurmError, SlurmJob

# The config's `runtime` defaults (config/schemas/config.schema.yaml), for callers without one.
DEFAULT_RUNTIME = {"bytecode_cache": False, "gc": "freeze"}


class RunFailed(RuntimeError):
    """Raised in strict mode for a run that was skipped or failed."""


class RunInterrupted(RuntimeError):
    """A launcher was killed from outside the run, or a rank stopped for a cause outside it (a
    full disk); the job fails without a result, so that a rerun resumes."""


def run(
    spec: RunSpec, *, checkpoint_path: Path, lock: bool = True, **settings: Any
) -> dict[str, Any]:
    """Run `spec` (`_run` says how) holding its lock (`_run_lock`) before it touches any of
    the run's files; `lock=False` where the caller holds it already."""
    with _run_lock(spec, checkpoint_path) if lock else contextlib.nullcontext():
        return _run(spec, checkpoint_path=checkpoint_path, **settings)


def _run(
    spec: RunSpec,
    *,
    run_dir: Path,
    data_dir: Path,
    checkpoint_path: Path,
    log: IO[str],
    threads: int,
    strict: bool = False,
    isolation: str = "host",
    host_cache: Path | None = None,
    runtime: Mapping[str, Any] = DEFAULT_RUNTIME,
) -> dict[str, Any]:
    """Run `spec`, resuming from `checkpoint_path` when it holds this spec's last finished
    epoch; write `<run_dir>/metrics.json` and return its content. The host is probed once per
    boot into `host_cache` (supervisor/hardware.py `host_facts`), or in this process when
    None. `runtime` is the config's: how the job's Python processes run."""
    fault = _fault_for(spec)  # a mistyped drill, or one that can't fire, stops here
    host, built = _begin(spec, run_dir, host_cache)
    metrics = run_dir / "metrics.json"
    reason: str | None
    try:
        slurm = SlurmJob.current()
    except SlurmError as e:
        reason = f"can't tell the nodes of Slurm job {os.environ['SLURM_JOB_ID']}: {e}"
        return _end(metrics, built, "failed", reason, log, strict)
    # Nodes of this Slurm allocation run one agent each; otherwise all are emulated here.
    srun = slurm is not None and slurm.hosts(spec)
    if slurm:
        built.slurm(slurm.job_id, slurm.nodes, nodes_emulated=spec.nodes > 1 and not srun)
    nodes_here = 1 if srun else spec.nodes
    reason = missing_requirement(spec, host, nodes_here=nodes_here) or _data_problem(spec, data_dir)
    if reason:
        return _end(metrics, built, "skipped", reason, log, strict)

    # A local timed run holds its GPUs and cores, so runs can go side by side without sharing
    # either (dmls/supervisor/slots.py); in a Slurm job the allocation is the run's already.
    with contextlib.ExitStack() as held:
        reservation = None
        if isolation != "none" and slurm is None:
            reservation = held.enter_context(
                slots.reserve(
                    gpus_needed(spec, host, nodes_here),
                    threads,
                    gpu_names=slots.visible_gpus(host.gpu_count),
                    on_wait=lambda line: print(line, file=log, flush=True),
                )
            )
            built.reserved(reservation.to_dict())
        commands = _commands(
            spec,
            run_dir,
            data_dir,
            checkpoint_path,
            device=built.record["derived"]["device"],
            # srun is true only with a Slurm job
            port=cast(SlurmJob, slurm).rendezvous_port if srun else launch.free_port(),
            threads=threads,
            srun=srun,
            runtime=runtime,
        )
        built.launched(
            commands,
            threads=threads,
            isolation=isolation,
            load_average_before=os.getloadavg(),
            fault=os.environ[protocol.ENV] if fault else None,
            runtime=runtime,
        )
        exit_codes, seconds, first_failure = _start_and_wait(
            commands, log, reservation, heartbeat=joblog.heartbeat(spec.run_id, log)
        )
        built.exited(exit_codes, seconds)
        return _collect(
            spec, built, run_dir, checkpoint_path, exit_codes, first_failure, log, strict
        )


def _begin(
    spec: RunSpec, run_dir: Path, host_cache: Path | None
) -> tuple[Host, run_record.Builder]:
    """The run's folder cleared of what a previous attempt may have left (Snakemake only
    removes the declared output), and its record begun: the spec, the device it resolves to
    on this host and the host's facts (probed once per boot into `host_cache`, or here)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    protocol.clear_reports(run_dir)
    for left in [run_dir / "history.csv", *run_dir.glob("model*.pt")]:
        left.unlink(missing_ok=True)
    host, software = (
        host_facts(host_cache) if host_cache is not None else (Host.probe(), describe())
    )
    built = run_record.Builder(
        spec,
        device=resolved_device(spec, host),
        nodes_emulated=spec.nodes > 1,
        host={"hostname": host.hostname, "gpus": list(host.cuda_devices), **software},
    )
    return host, built


def _fault_for(spec: RunSpec) -> Fault | None:
    """The fault drill `DMLS_FAULT` asks of this run, None when none; ValueError when the
    variable is mistyped or the drill can't fire in this run."""
    fault = Fault.from_env()
    if fault is None or not fault.targets(spec.run_id):
        return None
    seeds = [s.seed for s in spec.seed_specs()]
    if problem := fault.cannot_fire(spec.processes, spec.epochs, seeds):
        raise ValueError(f"{spec.run_id}: {problem}")
    return fault


def _commands(
    spec: RunSpec,
    run_dir: Path,
    data_dir: Path,
    checkpoint_path: Path,
    *,
    device: str,
    port: int,
    threads: int,
    srun: bool,
    runtime: Mapping[str, Any],
) -> list[launch.Command]:
    """The launcher commands that start the run's ranks, each with its environment."""
    worker_args = [
        "--spec",
        spec.to_json(),
        "--data-dir",
        str(data_dir),
        "--run-dir",
        str(run_dir),
        "--checkpoint",
        str(checkpoint_path),
        "--gc",
        runtime["gc"],
    ]
    commands = launch.build_commands(
        spec, worker_args, device=device, port=port, threads=threads, srun=srun
    )
    if runtime["bytecode_cache"]:
        cache = bytecode.environment()
        commands = [dataclasses.replace(c, env=c.env | cache) for c in commands]
    return commands


def _collect(
    spec: RunSpec,
    built: run_record.Builder,
    run_dir: Path,
    checkpoint_path: Path,
    exit_codes: list[int],
    first_failure: int | None,
    log: IO[str],
    strict: bool,
) -> dict[str, Any]:
    """The run's record once its launchers have exited: trained (the rank's result), failed
    (the reason names the rank that caused it), or interrupted (no record: a rerun resumes)."""
    launcher_output = Path(log.name).read_text(errors="replace") if any(exit_codes) else ""
    interrupted = _interruption(spec, first_failure, run_dir, checkpoint_path, launcher_output)
    if interrupted is not None:
        print(f"INTERRUPTED {interrupted}", file=log, flush=True)
        raise RunInterrupted(interrupted)
    result = run_dir / protocol.RESULT
    if any(exit_codes) or not result.exists():
        launcher_output = launcher_output or Path(log.name).read_text(errors="replace")
        reason = processes.failure_reason(run_dir, exit_codes, launcher_output, Path(log.name).name)
        # The checkpoint stays: after fixing the cause, a forced rerun resumes from it.
        return _end(run_dir / "metrics.json", built, "failed", reason, log, strict)
    record = built.trained(read_json(result))
    result.unlink()
    _write_history(run_dir / "history.csv", record["seeds"])
    record = _finish(run_dir / "metrics.json", record, strict)
    # Only now, with its result on disk: the run has ended, nothing is left to resume.
    for path in spec.seed_checkpoints(checkpoint_path):
        path.unlink(missing_ok=True)
    return record


def _end(
    path: Path, built: run_record.Builder, status: str, reason: str, log: IO[str], strict: bool
) -> dict[str, Any]:
    """Record a run that did not train (skipped, failed) and say so in its log."""
    print(
        f"{status.upper()} {built.record['study']}/{built.record['run']}: {reason}",
        file=log,
        flush=True,
    )
    return _finish(path, built.ended(status, reason), strict)


class RunBusy(RuntimeError):
    """Another workflow trains the same run into the same results folder."""


@contextlib.contextmanager
def _run_lock(spec: RunSpec, checkpoint_path: Path) -> Iterator[None]:
    """Hold the run's lock while it trains: within one Snakemake a run never trains twice at
    once, but two checkouts (or two Snakemakes) sharing a results_dir would, and one would
    resume from the other's checkpoint. flock: the kernel drops it when the holder dies. (On a
    network filesystem flock may not reach other hosts: give each cluster workflow its own
    results_dir.)"""
    path = checkpoint_path.with_name(checkpoint_path.name + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise RunBusy(
            f"{spec.run_id} is being trained by another workflow into the same results folder "
            f"(it holds {path}); let that one finish, or give this checkout its own results_dir"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _data_problem(spec: RunSpec, data_dir: Path) -> str | None:
    manifest = read_json(data_dir / f"{spec.dataset}.json")
    if manifest["status"] != "ok":
        return f"dataset {spec.dataset} unavailable: {manifest['reason']}"
    return None


def _start_and_wait(
    commands: list[launch.Command],
    log: IO[str],
    reservation: slots.Reservation | None = None,
    heartbeat: Callable[[float], None] | None = None,
) -> tuple[list[int], float, int | None]:
    """Start every command (one per emulated node, or one srun), inside `reservation`'s GPUs
    and cores when there is one, and wait for all (supervisor/processes.py: if one fails, the
    others are stopped; `heartbeat` says the run is alive in the terminal). Returns the exit
    codes, the seconds taken and the exit code of the first launcher that failed (None if none
    did)."""
    outcome = processes.start_and_wait(
        commands,
        log,
        env=reservation.environment() if reservation else None,
        in_child=reservation.pin if reservation else None,
        heartbeat=heartbeat,
    )
    return outcome.exit_codes, outcome.seconds, outcome.first_failure


def _interruption(
    spec: RunSpec,
    first_failure: int | None,
    run_dir: Path,
    checkpoint_path: Path,
    launcher_output: str = "",
) -> str | None:
    """Why the run ended without a result of its own, to resume rather than record (a launcher
    killed from outside, a node lost as its Slurm step started, a rank stopped by a full
    disk), or None."""
    if first_failure is not None and first_failure < 0:
        return (
            f"{spec.run_id}: a launcher was killed by {signal.Signals(-first_failure).name} "
            "from outside the run (kill, preemption, OOM killer). That is no result, so none "
            f"is recorded: rerun the workflow and the run resumes "
            f"{_resumes_from(spec, checkpoint_path)}"
        )
    # The cluster failed the run, not its training: recorded as failed, the run would be done
    # for Snakemake, and neither the profile's retry nor the same command would train it again.
    if first_failure is not None and (lost := processes.launch_failure(launcher_output)):
        resume = _resumes_from(spec, checkpoint_path)
        return (
            f"{spec.run_id}: {lost}. The node failed, not the run, so no result is recorded: "
            "the job fails (its Slurm log is kept), and Snakemake's retry (profiles/slurm) or "
            f"the same command trains the run again, resuming {resume}"
        )
    if first_failure is not None and (stopped := _resumable_error(run_dir)) is not None:
        return (
            f"{spec.run_id}: rank {stopped['rank']} stopped: {stopped['error']}. That is no "
            "result, so none is recorded: rerun the workflow once that is fixed"
        )
    return None


def _resumes_from(spec: RunSpec, checkpoint_path: Path) -> str:
    """Where a rerun of `spec` resumes: the epochs its seeds' checkpoints hold, or epoch 1."""
    saved = [p for p in spec.seed_checkpoints(checkpoint_path) if p.exists()]
    if saved:
        return f"from its last finished epoch ({', '.join(map(str, saved))})"
    return "from epoch 1 (no epoch had finished)"


def _resumable_error(run_dir: Path) -> dict[str, Any] | None:
    """The first error a rank reported that leaves the run to resume, not failed (a full disk:
    training/checkpoint.py `DiskFull`), or None."""
    return next((r for r in protocol.error_reports(run_dir) if r.get("resumable")), None)


def _write_history(path: Path, seeds: list[dict[str, Any]]) -> None:
    """Every seed's epochs, one row each."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=("seed", *run_record.HISTORY_COLUMNS))
        writer.writeheader()
        writer.writerows({"seed": s["seed"]} | row for s in seeds for row in s["history"])


def _finish(path: Path, record: dict[str, Any], strict: bool) -> dict[str, Any]:
    run_record.finish(path, record)
    if strict and record["status"] in ("skipped", "failed"):
        raise RunFailed(f"{record['study']}/{record['run']} {record['status']}: {record['reason']}")
    return record


def main_from_snakemake(snakemake: Any) -> None:
    """Entry of the `train` rule (workflow/scripts/train.py). The run's lock comes
    first: a second workflow training the same run into the same folder fails here, before it
    opens (and truncates) the rule's log, which the launchers' output then goes to."""
    # If Snakemake is killed, stop too (and the launchers with us): a run finished behind its
    # back would be marked incomplete and trained again from scratch, its checkpoint gone.
    protocol.die_with_parent(signal.SIGTERM)
    spec = RunSpec.from_json(snakemake.params.spec)
    results_dir = Path(snakemake.config["results_dir"])
    # Outside the rule's outputs: Snakemake must not delete it with an incomplete run.
    checkpoint_path = spec.checkpoint_path(results_dir)
    with _run_lock(spec, checkpoint_path), job_log(snakemake.log[0]) as log:
        run(
            spec,
            checkpoint_path=checkpoint_path,
            lock=False,
            run_dir=Path(snakemake.output.metrics).parent,
            data_dir=Path(snakemake.input.manifest).parent,
            log=log,
            threads=snakemake.threads,
            strict=snakemake.config["strict"],
            isolation=snakemake.config["isolation"],
            host_cache=results_dir / "hosts",
            runtime=snakemake.config["runtime"],
        )
