"""Faults of the cluster itself, on the 2-node cluster of .ci/slurm-cluster, through
`snakemake --profile profiles/slurm`: a node lost as a 2-node job starts, a submission Slurm
refuses, and what `.ci/slurm-cluster status` says while a node is down."""

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from dmls.files import read_json
from dmls.supervisor.slurm import submission_problem
from test_slurm_cluster import (  # noqa: F401 (slurm_cluster: the fixture, used by name)
    BIN,
    CLUSTER,
    NODES,
    ROOT,
    STATUS_CHECKS,
    SUBMITTED,
    slurm_cluster,
    targets,
)

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

RUN = "cluster_torchrun/n2xp1"  # B1's 2-node run: one torchrun agent per Slurm node


def profile_command(results: Path, *args: str) -> list[str]:
    return [
        str(BIN / "snakemake"), "--profile", "profiles/slurm", *STATUS_CHECKS,
        "--slurm-logdir", str(results / "slurm_logs"), "--configfile", ".test/config.yaml",
        "--config", f"results_dir={results}", *args,
    ]  # fmt: skip


def cluster(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLUSTER, *args], capture_output=True, text=True, timeout=120)


def train_job_state() -> tuple[str, str] | None:
    """(job id, state) of this run's train job in Slurm's queue, or None."""
    wanted = f"rule_train_wildcards_{RUN.replace('/', '_')}"
    out = subprocess.run(
        ["squeue", "--noheader", "--format", "%i %k %T"], capture_output=True, text=True
    ).stdout
    jobs = [line.split() for line in out.splitlines()]
    return next(((job, state) for job, comment, state in jobs if comment == wanted), None)


def wait_for(what: str, seconds: float, check):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {seconds:g} s")


def test_a_node_lost_as_a_2_node_job_starts_is_named_and_trained_again(tmp_path):
    """node2's slurmd is killed as the run's job starts, before the job's srun step starts a
    task there: srun fails ("Task launch for StepId=… failed on node node2: Communication
    connection failure"). The reason names node2 and srun's message; the job fails without a
    metrics.json, its Slurm log is kept, and once node2 is back the profile's retry trains the
    run on both nodes, in the same command. Before: "launcher exited with codes [233] and no
    rank reported an error", a failed metrics.json, a job that exited 0 and a deleted Slurm
    log, and the same command then said "Nothing to be done"."""
    if subprocess.run(["squeue", "--noheader"], capture_output=True, text=True).stdout.strip():
        pytest.skip("other jobs are on the cluster: losing a node would fail them too")
    started = time.monotonic()
    snakemake = subprocess.Popen(
        profile_command(tmp_path, *targets(tmp_path, [RUN])),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=os.environ | {"DMLS_SLURM_WATCH_S": "5"},  # (what Slurm says, every 5 s)
    )  # fmt: skip
    train_log = tmp_path / "runs" / RUN / "train.log"
    try:
        # The job's own Snakemake takes seconds to start before srun: node2 goes first.
        first, _ = wait_for("the train job running", 300, lambda: _running(train_job_state()))
        assert cluster("fail-node", "node2").returncode == 0
        wait_for("the run interrupted", 120, lambda: "INTERRUPTED" in _text(train_log))
        status = cluster("status")
        assert status.returncode == 1, status.stdout
        assert "slurmd node2: down (no process" in status.stdout
        assert "slurmd node1: up (pid " in status.stdout
        assert "partly up; down: slurmd node2" in status.stdout
        interrupted = _text(train_log)
        assert cluster("start").returncode == 0
        output, _ = snakemake.communicate(timeout=900)
    finally:
        if snakemake.poll() is None:
            snakemake.terminate()
            snakemake.wait(60)
        cluster("start")  # node2 back whatever happened
    seconds = time.monotonic() - started
    assert snakemake.returncode == 0, output[-5000:]

    lost = (
        f"srun could not start a task on node node2 (srun: Task launch for StepId={first}.0 "
        "failed on node node2: Communication connection failure)"
    )
    assert f"INTERRUPTED {RUN}: {lost}. The node failed, not the run" in interrupted
    assert "resuming from epoch 1 (no epoch had finished)" in interrupted
    trains = [(job, log) for job, rule, log in _submissions(output) if rule == "train"]
    assert len(trains) == 2 and trains[0][0] == first, trains
    # The failed attempt's Slurm log is kept, with the reason; the retry's is deleted (ok).
    kept = tmp_path / "slurm_logs" / "rule_train" / RUN.replace("/", "_") / f"{first}.log"
    assert lost in kept.read_text(errors="replace")
    assert f"SLURM-job '{first}' failed, SLURM status is: 'FAILED'" in output
    assert "Trying to restart job" in output
    # Issue #55 (8): what Slurm says of the job is in the terminal within a period of its end
    # (before: 6 min 30 s of silence), and again in the last lines.
    ended = re.search(
        rf"^\[(\d\d:\d\d:\d\d)\] Slurm: job {first} \(train cluster_torchrun_n2xp1\) ended "
        r"FAILED on node\[1-2\]", output, re.M,
    )  # fmt: skip
    assert ended, output[-5000:]
    closing = output[output.index("Runs by study:") :]
    assert re.search(rf"^  job {first} \(train cluster_torchrun_n2xp1\): FAILED on node\[1-2\]",
                     closing, re.M)  # fmt: skip
    assert f"{RUN}: {lost}. The node failed" in closing  # (the node, named in the last lines)
    assert re.search(r"^\[\d\d:\d\d:\d\d\] Slurm: 1 running \(train cluster_torchrun_n2xp1 ",
                     output, re.M)  # fmt: skip

    metrics = read_json(tmp_path / "runs" / RUN / "metrics.json")
    assert metrics["status"] == "ok", metrics.get("reason")
    assert metrics["slurm"]["job_id"] == trains[1][0] != first
    assert sorted(r["slurm_node"] for r in metrics["ranks"]) == NODES
    assert len(metrics["history"]) == 2  # both epochs, trained by the retry
    assert cluster("status").returncode == 0
    print(f"\nnode lost at launch, then trained by the retry: {seconds:.0f} s")
    print(*(line for line in output.splitlines() if "Slurm:" in line or (line.startswith("  ")
            and line.lstrip().startswith(("job ", "node ")))), sep="\n")  # fmt: skip


def _running(state: tuple[str, str] | None) -> tuple[str, str] | None:
    return state if state and state[1] == "RUNNING" else None


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _submissions(output: str) -> list[tuple[str, str, str]]:
    """(Slurm job id, rule, wildcards) of each submission, in order."""
    return SUBMITTED.findall(output)


def test_a_partition_slurm_refuses_fails_once_with_sbatchs_message(tmp_path):
    """Checked before any job (`sbatch --test-only`). Before: the submission was refused,
    then tried again by the profile's retry and refused again, the same error twice."""
    start = time.monotonic()
    out = subprocess.run(
        profile_command(tmp_path, *targets(tmp_path, [RUN])), cwd=ROOT, capture_output=True,
        text=True, timeout=120, env=os.environ | {"SBATCH_PARTITION": "nosuch"},
    )  # fmt: skip
    assert out.returncode != 0 and time.monotonic() - start < 60
    assert (
        "Slurm refuses this workflow's jobs (SBATCH_PARTITION=nosuch): sbatch: error: invalid "
        "partition specified: nosuch" in out.stderr
    )
    assert len(re.findall("invalid partition specified", out.stderr)) == 1
    assert "Trying to restart job" not in out.stderr and not SUBMITTED.findall(out.stderr)
    # A partition given as a default resource, as the profile's comment says one may, is
    # checked alike. Before: it skipped the check, and sbatch refused the job twice.
    out = subprocess.run(
        profile_command(tmp_path, "--default-resources", "slurm_partition=nosuch",
                        "runtime=30", "mem_mb=4000", *targets(tmp_path, [RUN])),
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    assert (
        "Slurm refuses this workflow's jobs (slurm_partition=nosuch): sbatch: error: invalid "
        "partition specified: nosuch" in out.stderr
    )
    assert len(re.findall("invalid partition specified", out.stderr)) == 1
    assert not SUBMITTED.findall(out.stderr)
    assert submission_problem(partition="nosuch").startswith(
        "Slurm refuses this workflow's jobs (slurm_partition=nosuch): sbatch: error: invalid "
        "partition specified: nosuch"
    )
    assert submission_problem() is None and submission_problem(partition="local") is None
