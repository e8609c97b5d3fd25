"""Runs on a Slurm cluster: what a training job asks for, and which nodes it finds itself on.

`job_resources` is the one place a run spec becomes scheduler resources (rules/train.smk asks
it for every run). `SlurmJob` is the allocation a run is inside of; with several nodes,
launch.py starts one launcher agent per node of it through `srun`. Slurm is asked through its
own commands: inside a multi-node job, Snakemake's jobstep plugin leaves only SLURM_JOB_ID (and
SLURM_CLUSTER_NAME, SLURM_SUBMIT_*) of the allocation's variables, not its node list.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from dmls.config.spec import RunSpec

# Rendezvous ports are taken from here on, below Linux's ephemeral range (32768-60999) so no
# outgoing connection holds one by chance.
RENDEZVOUS_PORT_BASE = 20000
RENDEZVOUS_PORTS = 10000


class SlurmError(RuntimeError):
    """Slurm could not tell where this job runs."""


@dataclass(frozen=True)
class JobResources:
    """What one training run needs from a scheduler: one task (a launcher agent) per node."""

    nodes: int
    tasks: int
    cpus_per_task: int
    gpus_per_node: int
    mem_mb: int  # per node
    runtime_min: int

    def rule_resources(self, *, on_cluster: bool) -> dict[str, int | str | None]:
        """The `train` rule's resources, named as snakemake-executor-plugin-slurm reads them.

        None leaves a resource unset. A local run uses only `gpu` (capped by `--resources`).
        """
        multi_node = self.nodes > 1
        return {
            "nodes": self.nodes,
            # Several nodes: launch.py starts the one task per node with its own `srun`;
            # `mpi` tells the plugin so, instead of wrapping the job in `srun -n1` on one node.
            "tasks": self.tasks if multi_node else None,
            "mpi": "srun" if multi_node else None,
            "cpus_per_task": self.cpus_per_task,
            "mem_mb": self.mem_mb,
            "runtime": self.runtime_min,
            # Locally `gpu` is the run's total. On a cluster GPUs are asked per node
            # (`--gres=gpu:N`); tasks_per_gpu=0 keeps the plugin from turning `tasks` into
            # `--ntasks-per-gpu` (plugin issues #316, #459).
            "gpu": None if on_cluster else self.gpus_per_node * self.nodes,
            "gres": f"gpu:{self.gpus_per_node}" if on_cluster and self.gpus_per_node else None,
            "tasks_per_gpu": 0 if on_cluster and self.gpus_per_node and multi_node else None,
        }


def job_resources(spec: RunSpec, cluster: Mapping[str, int], attempt: int = 1) -> JobResources:
    """The resources of `spec`'s run, sized by the config's `cluster` section. A retried job
    (Snakemake's `attempt`) gets `attempt` times the memory and time: the usual reasons Slurm
    ends a training job are running out of either."""
    processes_per_node = spec.processes // spec.nodes
    return JobResources(
        nodes=spec.nodes,
        tasks=spec.nodes,
        cpus_per_task=spec.cpu_shares // spec.nodes * cluster["cpus_per_process"],
        gpus_per_node=spec.requested_gpus // spec.nodes,
        mem_mb=processes_per_node * cluster["mem_mb_per_process"] * attempt,
        runtime_min=cluster["runtime_minutes"] * attempt,
    )


def study_job_resources(
    processes: int, nodes: int, cluster: Mapping[str, int], attempt: int = 1
) -> JobResources:
    """The resources of a special study's job whose parts start up to `processes` ranks on the
    job's first node, and some of them over `nodes` nodes with an srun step of their own (the
    collectives sweep's `gloo-cpu-slurm`): one task per node, each node sized as a training
    run's node of `processes` processes (the config's `cluster` section), so that the steps
    run inside the job's allocation. A retried job gets `attempt` times the memory and time."""
    return JobResources(
        nodes=nodes,
        tasks=nodes,
        cpus_per_task=processes * cluster["cpus_per_process"],
        gpus_per_node=0,
        mem_mb=processes * cluster["mem_mb_per_process"] * attempt,
        runtime_min=cluster["runtime_minutes"] * attempt,
    )


@dataclass(frozen=True)
class SlurmJob:
    """The Slurm allocation this process runs in."""

    job_id: str
    nodes: tuple[str, ...]

    @classmethod
    def current(cls) -> SlurmJob | None:
        """The allocation named by SLURM_JOB_ID, or None outside Slurm."""
        job_id = os.environ.get("SLURM_JOB_ID")
        if not job_id:
            return None
        nodelist = _slurm("squeue", "--noheader", "--jobs", job_id, "--format", "%N")
        return cls(job_id, expand_hostlist(nodelist))

    @property
    def rendezvous_port(self) -> int:
        """A port every node derives alike from the job id, so jobs sharing a node differ."""
        return RENDEZVOUS_PORT_BASE + int(self.job_id) % RENDEZVOUS_PORTS

    def hosts(self, spec: RunSpec) -> bool:
        """Whether `spec`'s nodes are nodes of this allocation (else they are emulated here)."""
        return 1 < spec.nodes <= len(self.nodes)


@dataclass(frozen=True)
class SrunTask:
    """One task of an `srun` step, as Slurm describes it in the task's environment."""

    node_rank: int
    first_node: str

    @classmethod
    def current(cls) -> SrunTask:
        try:
            node_rank, nodelist = os.environ["SLURM_NODEID"], os.environ["SLURM_STEP_NODELIST"]
        except KeyError as missing:
            raise SlurmError(f"{missing} is unset: start this through srun") from None
        return cls(int(node_rank), expand_hostlist(nodelist)[0])


def status_check_problem(
    status_command: str,
    init_seconds: int,
    *,
    partition: str | None = None,
    account: str | None = None,
) -> str | None:
    """Why this workflow's jobs can't go through this cluster (`submission_problem`), or why
    snakemake-executor-plugin-slurm would never see them end; None when neither.

    The plugin asks `sacct` for job states, or `squeue` when told to, but squeue only while
    Slurm keeps ended jobs (MinJobAge) for 3 × the delay of its first check; else it falls
    back to sacct. Without accounting (no slurmdbd) sacct fails, and Snakemake waits forever
    for jobs that ended long ago.
    """
    if refused := submission_problem(partition=partition, account=account):
        return refused
    min_job_age = int(_config_value("MinJobAge").split()[0])
    if status_command == "squeue" and min_job_age >= 3 * init_seconds:
        return None
    sacct = subprocess.run(
        ["sacct", "--noheader", "-X", "--format=JobIdRaw"], capture_output=True, text=True
    )
    if sacct.returncode == 0:
        return None
    fix = (
        "pass --slurm-status-command squeue"
        if status_command != "squeue"
        else f"lower --slurm-init-seconds-before-status-checks to {min_job_age // 3} or less"
    )
    return (
        f"`sacct` can't report job states here ({sacct.stderr.strip()}), so Snakemake would "
        f"wait forever for jobs that ended: {fix} (squeue sees ended jobs for MinJobAge = "
        f"{min_job_age} s, which must be at least 3 × the first status check's delay)"
    )


# What sbatch says where no controller answers (Slurm's client installed, no cluster: no
# slurm.conf, or its controller down): not a refusal of a partition.
NO_CONTROLLER = (
    "Could not establish a configuration source",
    "Unable to contact slurm controller",
    "Unable to establish controller machine",
)


def submission_problem(*, partition: str | None = None, account: str | None = None) -> str | None:
    """Why Slurm refuses every job of this workflow, as sbatch says it, or None: a partition or
    account it does not know (`partition`, `account`: the default resources `slurm_partition`
    and `slurm_account`, which the profile fills from SBATCH_PARTITION and SBATCH_ACCOUNT;
    unset, sbatch reads those variables itself). Asked once before any job (`sbatch
    --test-only` submits nothing), since a refused submission is a failed job, which the
    profile's retry submits again to the same refusal. SlurmError where no cluster answered
    (`NO_CONTROLLER`): no partition is to blame."""
    chosen = {"--partition": partition, "--account": account}
    argv = ["sbatch", "--test-only", "--job-name", "dmls-check"]
    argv += [f"{option}={value}" for option, value in chosen.items() if value]
    try:
        out = subprocess.run([*argv, "--wrap", "true"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise SlurmError(f"`sbatch --test-only` failed: {e}") from e
    if out.returncode == 0:
        return None
    said = " / ".join(out.stderr.strip().splitlines())
    if any(sign in out.stderr for sign in NO_CONTROLLER):
        raise SlurmError(f"no Slurm cluster answered `sbatch --test-only`: {said}")
    given, fixes = [], []  # each as the user gave it (the profile turns SBATCH_* into slurm_*)
    for key, value, variable in (
        ("slurm_partition", partition, "SBATCH_PARTITION"),
        ("slurm_account", account, "SBATCH_ACCOUNT"),
    ):
        if value and value != os.environ.get(variable):
            given.append(f"{key}={value}")
            fixes.append(f"--default-resources {key}=…")
        elif os.environ.get(variable):
            given.append(f"{variable}={os.environ[variable]}")
            fixes.append(variable)
    where = ", ".join(given) or "the cluster's default partition, no account"
    fix = " and ".join(fixes) or "SBATCH_PARTITION and SBATCH_ACCOUNT"
    return (
        f"Slurm refuses this workflow's jobs ({where}): {said}. Give a partition `sinfo` "
        f"lists, and an account of yours where the cluster wants one, in {fix} "
        "(docs/slurm.md)"
    )


def _config_value(key: str) -> str:
    for line in _slurm("scontrol", "show", "config").splitlines():
        name, _, value = line.partition("=")
        if name.strip() == key:
            return value.strip()
    raise SlurmError(f"`scontrol show config` has no {key}")


def expand_hostlist(hostlist: str) -> tuple[str, ...]:
    """`node[1-2],gpu7` → ('node1', 'node2', 'gpu7'), as Slurm itself expands it."""
    return tuple(_slurm("scontrol", "show", "hostnames", hostlist).split())


def _slurm(*argv: str) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", None) or e
        raise SlurmError(f"`{' '.join(argv)}` failed: {str(detail).strip()}") from e
    if not out.stdout.strip():
        raise SlurmError(f"`{' '.join(argv)}` printed nothing")
    return out.stdout.strip()
