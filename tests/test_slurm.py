"""What a run asks Slurm for, derived from its spec in one place (dmls.supervisor.slurm), and
what the supervisor makes of srun's own errors (dmls.supervisor.processes)."""

import pytest

from conftest import make_spec
from dmls.supervisor import processes, supervise
from dmls.supervisor.hardware import Host, gpus_needed
from dmls.supervisor.slurm import (
    RENDEZVOUS_PORT_BASE,
    SlurmError,
    SlurmJob,
    SrunTask,
    job_resources,
    study_job_resources,
)

CLUSTER = {"cpus_per_process": 3, "mem_mb_per_process": 2000, "runtime_minutes": 45}


def test_a_cpu_grid_run_asks_one_task_per_node_with_the_cpus_of_its_processes():
    spec = make_spec(launcher="torchrun", nodes=2, nproc_per_node=2, device="cpu")
    res = job_resources(spec, CLUSTER)
    assert (res.nodes, res.tasks, res.cpus_per_task, res.gpus_per_node) == (2, 2, 6, 0)
    assert (res.mem_mb, res.runtime_min) == (4000, 45)  # memory per node: 2 processes
    slurm = res.rule_resources(on_cluster=True)
    # Several nodes: the plugin must not wrap the job in `srun -n1`; launch.py runs srun.
    assert slurm["mpi"] == "srun" and slurm["tasks"] == 2 and slurm["nodes"] == 2
    assert slurm["gres"] is None and slurm["gpu"] is None and slurm["tasks_per_gpu"] is None
    assert res.rule_resources(on_cluster=False)["gpu"] == 0


def test_a_single_node_run_is_an_ordinary_job():
    spec = make_spec(launcher="accelerate", nproc_per_node=2, device="cpu")
    slurm = job_resources(spec, CLUSTER).rule_resources(on_cluster=True)
    assert slurm["nodes"] == 1 and slurm["cpus_per_task"] == 6
    assert slurm["tasks"] is None and slurm["mpi"] is None
    single = job_resources(make_spec(launcher="single", device="cpu"), CLUSTER)
    assert (single.cpus_per_task, single.mem_mb) == (3, 2000)


def test_gpus_are_asked_per_node_on_a_cluster_and_in_total_locally():
    dp = job_resources(make_spec(launcher="dp", nproc_per_node=2, device="cuda"), CLUSTER)
    # DataParallel: one process, with the cores of one per GPU it drives (as DDP's two ranks)
    assert dp.gpus_per_node == 2 and dp.cpus_per_task == 6 and dp.mem_mb == 2000
    on_slurm = dp.rule_resources(on_cluster=True)
    assert on_slurm["gres"] == "gpu:2" and on_slurm["gpu"] is None
    assert on_slurm["tasks_per_gpu"] is None
    assert dp.rule_resources(on_cluster=False)["gpu"] == 2

    spec = make_spec(launcher="torchrun", nodes=2, nproc_per_node=4, backend="nccl")
    grid = job_resources(spec, CLUSTER)
    on_slurm = grid.rule_resources(on_cluster=True)
    assert on_slurm["gres"] == "gpu:4" and on_slurm["tasks"] == 2
    # Else the plugin turns `tasks` into --ntasks-per-gpu=2 (its issues #316, #459).
    assert on_slurm["tasks_per_gpu"] == 0
    assert grid.rule_resources(on_cluster=False)["gpu"] == 8


def test_a_retried_job_gets_more_memory_and_time():
    spec = make_spec(launcher="single", device="cpu")
    first, second = job_resources(spec, CLUSTER), job_resources(spec, CLUSTER, attempt=2)
    assert (second.mem_mb, second.runtime_min) == (2 * first.mem_mb, 2 * first.runtime_min)
    assert second.cpus_per_task == first.cpus_per_task


def test_the_rendezvous_port_follows_the_job_id():
    ports = [SlurmJob(str(job_id), ("a", "b")).rendezvous_port for job_id in (7, 8, 10007)]
    assert ports == [RENDEZVOUS_PORT_BASE + 7, RENDEZVOUS_PORT_BASE + 8, RENDEZVOUS_PORT_BASE + 7]


def test_only_an_allocation_with_enough_nodes_hosts_a_multi_node_run():
    two_nodes = make_spec(launcher="torchrun", nodes=2)
    assert SlurmJob("5", ("node1", "node2")).hosts(two_nodes)
    # Inside a 1-node allocation (salloc, the plugin's single-node jobs), nodes are emulated.
    assert not SlurmJob("5", ("node1",)).hosts(two_nodes)
    assert not SlurmJob("5", ("node1", "node2")).hosts(make_spec(launcher="torchrun"))


def test_an_srun_task_needs_srun_variables(monkeypatch):
    monkeypatch.delenv("SLURM_NODEID", raising=False)
    with pytest.raises(SlurmError, match="SLURM_NODEID"):
        SrunTask.current()


def test_gpus_needed_counts_only_the_nodes_on_this_host():
    host = Host("h", 8, ("GPU",) * 4, ((9, 0),) * 4, True)
    spec = make_spec(launcher="torchrun", nodes=2, nproc_per_node=2, device="cuda")
    assert gpus_needed(spec, host, nodes_here=2) == 4  # emulated: both nodes here
    assert gpus_needed(spec, host, nodes_here=1) == 2  # a Slurm node of its own
    assert gpus_needed(make_spec(launcher="single", device="cpu"), host, nodes_here=1) == 0


def test_the_collectives_job_asks_for_the_nodes_its_srun_steps_span():
    """Before: the job got 1 node, and its sweep's `srun --nodes 2` failed ("Only allocated 1
    nodes asked for 2"). Each node gets the cores of the most ranks a setup puts on one host."""
    job = study_job_resources(4, 2, CLUSTER)
    slurm = job.rule_resources(on_cluster=True)
    assert (slurm["nodes"], slurm["tasks"], slurm["mpi"]) == (2, 2, "srun")
    assert (slurm["cpus_per_task"], slurm["mem_mb"], slurm["runtime"]) == (12, 8000, 45)
    assert slurm["gres"] is None and slurm["tasks_per_gpu"] is None
    one_node = study_job_resources(2, 1, CLUSTER, attempt=2).rule_resources(on_cluster=True)
    assert (one_node["nodes"], one_node["tasks"], one_node["mpi"]) == (1, None, None)
    assert (one_node["mem_mb"], one_node["runtime"]) == (8000, 90)


# srun's output when node2's slurmd was gone as a 2-node job's step started (measured on the
# test cluster: srun exited 233, having started node1's task).
LAUNCH_FAILED = """node 0 (node1) $ python -m torch.distributed.run --nnodes 2 ...
srun: error: Task launch for StepId=184.0 failed on node node2: Communication connection failure
srun: error: Application launch failed: Communication connection failure
srun: Job step aborted
"""
# torchrun's summary on node1 after srun stopped it (SIGTERM): no rank failed of itself.
STOPPED = """  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4136)  (SIGTERM)
"""


def test_srun_s_own_error_is_the_reason_and_names_the_node(tmp_path):
    """Before: "launcher exited with codes [233] and no rank reported an error", no node named;
    and in the collectives sweep "codes [1]" for "Only allocated 1 nodes asked for 2"."""

    def reason(output: str, codes: list[int]) -> str:
        return processes.failure_reason(tmp_path, codes, output, "train.log")

    lost = (
        "srun: Task launch for StepId=184.0 failed on node node2: Communication connection failure"
    )
    assert reason(LAUNCH_FAILED, [233]) == lost
    # The ranks srun stopped on the other node are its consequence, not a SIGTERM from outside.
    assert reason(STOPPED + LAUNCH_FAILED, [233]) == lost
    assert processes.launch_failure(LAUNCH_FAILED) == (
        f"srun could not start a task on node node2 ({lost})"
    )
    too_few = "srun: error: Only allocated 1 nodes asked for 2\n"
    assert reason(too_few, [1]) == "srun: Only allocated 1 nodes asked for 2"
    assert processes.launch_failure(too_few) is None  # no node failed: the job had too few
    # A task's exit, reported by srun, is a rank's failure: the ranks explain it, not srun.
    exited = "srun: error: node2: task 1: Exited with exit code 1\n"
    assert processes.srun_errors(exited) == [] and processes.launch_failure(exited) is None
    assert reason(exited, [1]) == (
        "launcher exited with codes [1] and no rank reported an error (see log)"
    )


def test_a_run_whose_launch_failed_on_a_node_fails_its_job_and_stays_resumable(
    tmp_path, tabular_dir, monkeypatch
):
    """No failed metrics.json (Snakemake would take the run as done: no retry, and the same
    command "Nothing to be done"), a job that fails with the node and srun's message in
    train.log, and the run's checkpoint kept for the retry to resume from."""
    spec = make_spec(
        launcher="torchrun", nodes=2, dataset="tabular", model={"name": "mlp"}, device="cpu"
    )
    run_dir, checkpoint_path = tmp_path / "run", tmp_path / "checkpoints" / "r.pt"
    saved = spec.seed_checkpoints(checkpoint_path)
    checkpoint_path.parent.mkdir()
    for path in saved:
        path.write_bytes(b"epoch 1")

    def launched(commands, log, reservation=None, heartbeat=None):
        log.write(LAUNCH_FAILED)
        log.flush()
        return [233], 1.5, 233

    monkeypatch.setattr(supervise, "_start_and_wait", launched)
    with open(tmp_path / "train.log", "w") as log, pytest.raises(supervise.RunInterrupted) as e:
        supervise.run(
            spec, run_dir=run_dir, data_dir=tabular_dir, checkpoint_path=checkpoint_path,
            log=log, threads=2,
        )  # fmt: skip
    assert str(e.value) == (
        "t/r: srun could not start a task on node node2 (srun: Task launch for StepId=184.0 "
        "failed on node node2: Communication connection failure). The node failed, not the "
        "run, so no result is recorded: the job fails (its Slurm log is kept), and Snakemake's "
        "retry (profiles/slurm) or the same command trains the run again, resuming from its "
        f"last finished epoch ({', '.join(map(str, saved))})"
    )
    assert f"INTERRUPTED {e.value}" in (tmp_path / "train.log").read_text()
    assert not (run_dir / "metrics.json").exists()
    assert all(path.read_bytes() == b"epoch 1" for path in saved)
