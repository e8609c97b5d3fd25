"""What a run asks Slurm for, derived from its spec in one place (dmls.supervisor.slurm)."""

import pytest

from conftest import make_spec
from dmls.supervisor.hardware import Host, gpus_needed
from dmls.supervisor.slurm import (
    RENDEZVOUS_PORT_BASE,
    SlurmError,
    SlurmJob,
    SrunTask,
    job_resources,
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
