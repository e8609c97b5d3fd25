"""What the Snakefile's hooks do (rules/common.smk: onstart, onsuccess, onerror), here where ruff
and the unit tests reach it: claim the results folder, check Slurm before any job, say what this
host will run and how long it should take, say which finished runs will be replaced, and print
how the DAG ended.

Each function takes what it reads (Snakemake's `workflow` object, the config, the resolved runs,
the results folder) as arguments; `rules/common.smk` only calls them. Nothing here is imported at
parse time beyond this module: the heavier modules are imported where a hook needs them, so
planning the DAG stays torch-free (tests/test_layers.py).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# A bare word of a resource, as Snakemake reads gpu or n1-standard-4.
_BARE_WORD = re.compile(r"[\w.,:+-]+")


class HookError(Exception):
    """A hook's refusal, with the fix: rules/common.smk raises it as Snakemake's WorkflowError
    (this module imports no Snakemake)."""


def say(text: str) -> None:
    """A line for the user, on the terminal's error stream (where Snakemake writes its own)."""
    print(text, file=sys.stderr)


def claim_results_dir(workflow: Any, results: str) -> Any | None:
    """Hold the results folder for this workflow before any job starts (and removes its old
    outputs): a second workflow on the same folder (another clone, another Snakemake) stops
    here, naming the one that holds it, and changes nothing. Onstart runs in the main Snakemake
    only: not in a dry run, --report or --lint, nor in the job processes it spawns or submits
    to Slurm (they get --no-hooks). Returns the claim (close it to release the folder), or None
    in a process that is not the main one."""
    from dmls.files import FolderBusy, claim_folder

    if not workflow.is_main_process:
        return None
    try:
        return claim_folder(Path(results), workflow.basedir)
    except FolderBusy as e:
        raise HookError(str(e)) from None


def default_submission_resource(default_resources: Mapping[str, Any] | None, name: str) -> Any:
    """The partition or account (`name`: slurm_partition, slurm_account) that every job gets
    from --default-resources or the profile's default-resources (`default_resources`: Snakemake's
    `workflow.resource_settings.default_resources`), as the Slurm plugin hands it to sbatch;
    None where unset or where it is an expression of the job (only its job knows). Before: a
    partition given this way skipped the check and Slurm's refusal came twice."""
    resource = default_resources.get(name) if default_resources else None
    if resource is None:
        return None
    if not resource.is_evaluable():
        value = resource.value
        return value if isinstance(value, str) and value else None
    raw = os.path.expandvars(str(resource.raw)).strip()
    try:  # a quoted string, or None (the profile's unset SBATCH_PARTITION)
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw if _BARE_WORD.fullmatch(raw) else None
    return value if isinstance(value, str) and value else None


def check_slurm_status_checks(workflow: Any) -> None:
    """Under Slurm, fail now with the fix rather than wait forever for jobs that ended; on a
    machine where no Slurm answers, say so and what to run instead (before: a SlurmError
    traceback about scontrol)."""
    from dmls.supervisor.slurm import SlurmError, status_check_problem

    if workflow.executor_plugin.name != "slurm":
        return
    instead = (
        "--profile profiles/slurm submits every job to Slurm, but no Slurm cluster answers "
        "here ({}). On a machine without Slurm run `snakemake --cores 4` instead (README: "
        "Which config to use); on a cluster, run from a node where `sinfo` works."
    )
    if shutil.which("sbatch") is None:
        raise HookError(instead.format("sbatch not found"))
    settings = workflow.executor_settings
    defaults = workflow.resource_settings.default_resources
    try:
        problem = status_check_problem(
            settings.status_command,
            settings.init_seconds_before_status_checks,
            partition=default_submission_resource(defaults, "slurm_partition"),
            account=default_submission_resource(defaults, "slurm_account"),
        )
    except SlurmError as e:
        raise HookError(instead.format(str(e).splitlines()[0])) from None
    if problem:
        raise HookError(problem)


def watch_slurm(workflow: Any, started: float) -> None:
    """Under Slurm, in the main Snakemake: what Slurm says of this workflow's jobs and their
    nodes, every minute in the terminal (dmls.supervisor.slurm_watch), for the last lines too."""
    from dmls.supervisor import slurm_watch

    if workflow.executor_plugin.name != "slurm" or not workflow.is_main_process:
        return
    executor = getattr(getattr(workflow, "scheduler", None), "_executor", None)
    run_id = getattr(executor, "run_uuid", None)  # the plugin's job name, where exposed
    period = float(os.environ.get("DMLS_SLURM_WATCH_S", slurm_watch.PERIOD_S))
    own = run_id if isinstance(run_id, str) else None
    logdir = getattr(workflow.executor_settings, "logdir", None) or ".snakemake/slurm_logs"
    watch = slurm_watch.Watch(os.getcwd(), started, own, period, logdir=Path(logdir).absolute())
    slurm_watch.WATCH = watch
    watch.start()


def check_fault_drill(runs: Mapping[str, Any]) -> None:
    """A fault drill (DMLS_FAULT) for a run the config lacks is an error before any job."""
    from dmls.protocol import Fault

    fault = Fault.from_env()
    if fault is not None:
        fault.check_run_exists(runs)


def advise_bytecode_cache(config: Mapping[str, Any]) -> None:
    """Where torch has no bytecode and the cache is off, say what turns it on (and go on)."""
    from dmls import bytecode

    if not config["runtime"]["bytecode_cache"] and (note := bytecode.advice()):
        say(note)


def advise_cores(workflow: Any, runs: Mapping[str, Any], isolation: str, on_cluster: bool) -> None:
    """Where --cores makes timed runs share cores, say so (and go on)."""
    from dmls.supervisor.slots import core_advice

    if on_cluster or not workflow.cores:
        return
    shares = {run_id: spec.cpu_shares for run_id, spec in runs.items()}
    cpus = len(os.sched_getaffinity(0))
    for line in core_advice(workflow.cores, cpus, shares, isolation):
        say(line)


def say_what_will_be_replaced(workflow: Any, runs: Mapping[str, Any], results: str) -> None:
    """Finished runs whose settings changed since (`--config seeds=1` on a finished folder)
    are trained again and replaced: say so before any job starts, of the runs this
    invocation's DAG trains (a run it doesn't target is left as it is: not named)."""
    from dmls import dag_outcome
    from dmls.supervisor.estimate import jobs_of

    jobs = jobs_of(workflow)
    training = None if jobs is None else {job.name for job in jobs if job.rule == "train"}
    planned = {
        run_id: spec.to_dict()
        for run_id, spec in runs.items()
        if training is None or run_id in training
    }
    if note := dag_outcome.replaced(planned, Path(results)):
        say(note)


def data_to_download(workflow: Any, data: Mapping[str, Any]) -> list[str]:
    """For each data set this DAG prepares and this host has no copy of (`data`: the config's
    `data` section): that it is downloaded by prepare_data, or, where the download is off or
    fails (offline), that what needs it is skipped with the reason."""
    from dmls.data import datasets

    try:
        prepared = sorted(
            {
                job.wildcards.dataset
                for job in workflow.dag.needrun_jobs()
                if job.rule.name == "prepare_data"
            }
        )
    except AttributeError:  # this Snakemake's scheduler is not readable
        return []
    said = []
    for name in prepared:
        cfg = data[name]
        if why := datasets.download_needed(name, cfg):
            then = (
                "prepare_data downloads it; offline, the runs and studies that need it are "
                "skipped with the reason"
                if cfg.get("download", True)
                else f"data.{name}.download is false: what needs it is skipped with the reason"
            )
            said.append(f"{why}: {then}.")
    return said


def say_what_this_host_will_run(
    workflow: Any, runs: Mapping[str, Any], results: str, config: Mapping[str, Any], schema: Any
) -> None:
    """On this host (not under Slurm, whose nodes are not this one and whose queue decides
    when jobs start), before any job: the runs it will train and skip, with why, then about
    how long the DAG's jobs take here, an estimate from measured costs said to be one
    (dmls/supervisor/estimate.py, config/costs.yaml). The host's facts are read once, as the
    runs' own checks read them (asked once per boot: supervisor/hardware.py)."""
    from dmls.supervisor.estimate import (
        estimate,
        jobs_of,
        load_costs,
        plain,
        said,
        write_estimate,
    )
    from dmls.supervisor.hardware import host_facts, plan

    if workflow.executor_plugin.name == "slurm":
        return
    host, _ = host_facts(Path(results) / "hosts")
    say(plan(runs, host))
    for why in data_to_download(workflow, config["data"]):
        say(why)
    jobs = jobs_of(workflow)
    if jobs is None:
        say("No estimate of the DAG's time: this Snakemake's scheduler is not readable.")
        return
    costs = load_costs(Path(workflow.basedir) / "config" / "costs.yaml")
    cores = min(workflow.cores, len(os.sched_getaffinity(0)))
    gpus = workflow.global_resources.get("gpu")
    gpus = None if gpus is None else plain(gpus)
    est, section = estimate(jobs, runs, host, cores, gpus, costs, config, schema)
    say(said(jobs, est, section, cores, gpus))
    write_estimate(Path(results) / "logs" / "estimate.json", jobs, est, cores, gpus)


def say_how_it_ended(
    run_metrics: list[str],
    results: str,
    study_outputs: list[str],
    started: float,
    stopped: bool,
) -> None:
    """How the runs and special studies ended: Snakemake's "100% done" counts jobs, and a
    skipped run's succeeds; where the DAG stopped, what it kept and how to go on."""
    from dmls import dag_outcome
    from dmls.supervisor import slurm_watch

    page = Path(results) / "report" / "report.html"
    said = dag_outcome.summary(run_metrics, page, study_outputs, started=started, stopped=stopped)
    if (watch := slurm_watch.WATCH) is not None:  # (under Slurm: the jobs and nodes that failed)
        watch.stop()
        said = "\n".join([said, *watch.closing()])
    say(said)
