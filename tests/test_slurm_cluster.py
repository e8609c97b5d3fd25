"""The pipeline on a real Slurm cluster: the 2-node cluster of .ci/slurm-cluster on this host,
`snakemake --profile profiles/slurm`, and the B studies of the .test config."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from dmls.files import read_json
from dmls.supervisor.slurm import expand_hostlist, status_check_problem

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
CLUSTER = ROOT / ".ci" / "slurm-cluster"
NODES = ["node1", "node2"]
# This cluster has no slurmdbd, so `sacct` knows no jobs: status checks go through squeue
# (docs/slurm.md), the first one 2 s after a submission instead of 40.
STATUS_CHECKS = [
    "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2",
]  # fmt: skip
B_RUNS = [
    f"{study}/{run}"
    for study in ("cluster_torchrun", "cluster_accelerate")
    for run in ("n1xp1", "n1xp2", "n2xp1", "n2xp2")
]
MULTI_NODE = [run_id for run_id in B_RUNS if "/n2x" in run_id]
# Two more B1 runs that ask for GPUs: each test node has two that are no devices, so Slurm
# places these as on a GPU cluster, and the pipeline then skips them for want of CUDA.
GPU_RUNS = {
    "gpu_n1xp2": {"nproc_per_node": 2, "device": "cuda"},
    "gpu_n2xp1": {"nodes": 2, "device": "cuda"},
}
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: \S+/rule_(\w+?)/(\S+)/")


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local cluster: used when it is up, else started here and stopped at the end."""
    if subprocess.run([CLUSTER, "status"], capture_output=True).returncode == 0:
        yield
        return
    if os.geteuid() != 0 or not shutil.which("slurmctld"):
        reason = (
            "no local Slurm cluster: needs root and Debian's slurmctld slurmd slurm-client "
            "munge (.ci/run installs them)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    subprocess.run([CLUSTER, "start"], check=True)
    try:
        yield
    finally:
        subprocess.run([CLUSTER, "stop"], check=True)


def snakemake(*args: str, timeout: int) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    out = subprocess.run(
        [str(BIN / "snakemake"), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    return out, time.monotonic() - start


def targets(results: Path, run_ids: list[str]) -> list[str]:
    return ["--", *(str(results / "runs" / run_id / "metrics.json") for run_id in run_ids)]


def on_slurm(results: Path, *args: str, timeout: int) -> tuple[subprocess.CompletedProcess, float]:
    return snakemake(
        "--profile", "profiles/slurm", *STATUS_CHECKS,
        "--slurm-logdir", str(results / "slurm_logs"), *args, timeout=timeout,
    )  # fmt: skip


def submitted_jobs(output: str) -> dict[str, str]:
    """'<rule>/<wildcards>' → Slurm job id, from Snakemake's log of its submissions."""
    return {f"{rule}/{wildcards}": job for job, rule, wildcards in SUBMITTED.findall(output)}


@pytest.fixture(scope="module")
def slurm_b(slurm_cluster, tmp_path_factory):
    """The B1 and B2 runs of the .test config and the GPU runs, every job through Slurm."""
    results = tmp_path_factory.mktemp("slurm")
    gpu_config = results / "gpu_runs.yaml"
    gpu_config.write_text(yaml.safe_dump({"studies": {"cluster_torchrun": {"runs": GPU_RUNS}}}))
    run_ids = B_RUNS + [f"cluster_torchrun/{run}" for run in GPU_RUNS]
    out, seconds = on_slurm(
        results, "--configfile", ".test/config.yaml", str(gpu_config), "--config",
        f"results_dir={results}", *targets(results, run_ids), timeout=1200,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-5000:]
    metrics = {run_id: read_json(results / "runs" / run_id / "metrics.json") for run_id in run_ids}
    return results, metrics, submitted_jobs(out.stderr), seconds


@pytest.fixture(scope="module")
def local_b(tmp_path_factory):
    """The same multi-node runs, emulated on this host by the local executor."""
    results = tmp_path_factory.mktemp("local")
    out, _ = snakemake(
        "--cores", "2", "--configfile", ".test/config.yaml", "--config",
        f"results_dir={results}", *targets(results, MULTI_NODE), timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-5000:]
    return {run_id: read_json(results / "runs" / run_id / "metrics.json") for run_id in MULTI_NODE}


def test_slurm_expands_node_lists_and_tells_each_task_its_node(slurm_cluster):
    assert expand_hostlist("node[1-2]") == tuple(NODES)
    probe = (
        "from dmls.supervisor.slurm import SrunTask; task = SrunTask.current(); "
        "print(task.node_rank, task.first_node)"
    )
    out = subprocess.run(
        ["srun", "--nodes", "2", "--ntasks", "2", sys.executable, "-c", probe],
        env=os.environ | {"PYTHONPATH": str(ROOT / "workflow" / "scripts")},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert sorted(out.stdout.splitlines()) == ["0 node1", "1 node1"]


def test_status_checks_that_could_never_see_a_job_end_are_refused(slurm_cluster, tmp_path):
    assert status_check_problem("squeue", 2) is None
    assert "--slurm-status-command squeue" in status_check_problem("sacct", 2)
    # MinJobAge is 300 s: with a first check after 200 s the plugin would fall back to sacct.
    assert "--slurm-init-seconds-before-status-checks to 100" in status_check_problem("squeue", 200)
    # The profile as shipped (sacct) on this cluster: an error at once, not an endless wait.
    out, seconds = snakemake(
        "--profile", "profiles/slurm", "--configfile", ".test/config.yaml",
        "--config", f"results_dir={tmp_path}", *targets(tmp_path, B_RUNS[:1]), timeout=120,
    )  # fmt: skip
    assert out.returncode != 0 and seconds < 60
    assert "pass --slurm-status-command squeue" in out.stderr
    assert not submitted_jobs(out.stderr)


def test_every_job_went_through_slurm(slurm_b, capsys):
    _, metrics, submitted, seconds = slurm_b
    # Every run and the data preparation, each its own Slurm job.
    assert set(submitted) == {"prepare_data/tabular"} | {
        f"train/{run_id.replace('/', '_')}" for run_id in metrics
    }
    assert len(set(submitted.values())) == len(submitted)
    lines = [f"Slurm DAG of the B1/B2 runs and 2 GPU runs: {seconds:.0f} s"]
    for run_id, m in metrics.items():
        job_id = submitted[f"train/{run_id.replace('/', '_')}"]
        assert m["slurm"]["job_id"] == job_id
        assert {r["slurm_job_id"] for r in m.get("ranks", [])} <= {job_id}
        placement = " ".join(f"rank{r['rank']}@{r['slurm_node']}" for r in m.get("ranks", []))
        lines.append(f"  {run_id:<28} job {job_id:>4}  {m['status']:<7} {placement or m['reason']}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_gpu_runs_get_their_gpus_per_node_from_slurm(slurm_b):
    _, metrics, submitted, _ = slurm_b
    for run, gpus_per_node in (("gpu_n1xp2", 2), ("gpu_n2xp1", 1)):
        m = metrics[f"cluster_torchrun/{run}"]
        nodes = GPU_RUNS[run].get("nodes", 1)
        job = subprocess.run(
            ["scontrol", "show", "job", submitted[f"train/cluster_torchrun_{run}"]],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert f"TresPerNode=gres:gpu:{gpus_per_node}" in job and f"NumNodes={nodes} " in job
        # One task per node, not the plugin's --ntasks-per-gpu (its issues #316, #459).
        assert f"NumTasks={nodes} " in job and "NtasksPerTRES" not in job
        assert len(m["slurm"]["nodes"]) == nodes and not m["derived"]["nodes_emulated"]
        # Each node has its GPUs, but this host no CUDA: the run is skipped with the reason.
        assert m["status"] == "skipped"
        assert f"needs {gpus_per_node} CUDA GPU(s) on this host" in m["reason"]


def test_multi_node_runs_ran_on_two_slurm_nodes(slurm_b):
    _, metrics, _, _ = slurm_b
    for run_id in B_RUNS:
        m = metrics[run_id]
        assert m["status"] == "ok", (run_id, m.get("reason"))
        spec, ranks = m["spec"], m["ranks"]
        assert m["world_size"] == len(ranks) == spec["nodes"] * spec["nproc_per_node"]
        assert not m["derived"]["nodes_emulated"]
        # Each node runs in its own UTS namespace: its host name is its Slurm node name.
        assert all(r["hostname"] == r["slurm_node"] for r in ranks)
        nodes = [r["slurm_node"] for r in ranks]
        if run_id in MULTI_NODE:
            assert m["slurm"]["nodes"] == NODES, run_id
            assert sorted(nodes) == sorted(NODES * spec["nproc_per_node"]), run_id
        else:
            assert len(set(nodes)) == 1 and nodes[0] in NODES, run_id


def test_multi_node_runs_match_the_local_emulation(slurm_b, local_b):
    _, metrics, _, _ = slurm_b
    for run_id, local in local_b.items():
        slurm = metrics[run_id]
        assert local["derived"]["nodes_emulated"] and local["slurm"] is None
        assert len(slurm["history"]) == len(local["history"]) == 2
        # Same seed, data shards and world size, one compute thread per process in both: the
        # same arithmetic wherever the ranks run; 1e-6 leaves room for gloo's reduction order.
        for on_slurm, emulated in zip(slurm["history"], local["history"], strict=True):
            for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
                assert on_slurm[key] == pytest.approx(emulated[key], abs=1e-6), (run_id, key)


def test_a_failing_job_is_reported_failed_promptly(slurm_cluster, tmp_path):
    # A run another workflow is training into the same results folder: its job fails at once
    # on its node, as it can't take the run's lock. (Bad data no longer reaches a job: it
    # stops Snakemake at parse, before any submission.)
    from filelock import FileLock

    results = tmp_path / "results"
    lock = FileLock(results / "checkpoints" / "cluster_torchrun" / "n1xp1.pt.lock")
    (results / "checkpoints" / "cluster_torchrun").mkdir(parents=True)
    with lock:
        # One attempt: the profile's retry would only repeat the same failure.
        out, seconds = on_slurm(
            results, "--configfile", ".test/config.yaml", "--config", f"results_dir={results}",
            "--retries", "0", *targets(results, ["cluster_torchrun/n1xp1"]), timeout=600,
        )  # fmt: skip
    assert out.returncode != 0
    (job_id,) = [job for key, job in submitted_jobs(out.stderr).items() if key.startswith("train/")]
    assert f"SLURM-job '{job_id}' failed, SLURM status is: 'FAILED'" in out.stderr
    text = "".join(p.read_text(errors="replace") for p in results.rglob("*.log") if p.is_file())
    assert "cluster_torchrun/n1xp1 is being trained by another workflow" in text
    assert not (results / "runs" / "cluster_torchrun" / "n1xp1" / "metrics.json").exists()
    assert seconds < 180


def test_the_collectives_sweep_runs_its_slurm_parts_inside_its_2_node_job(slurm_cluster, tmp_path):
    """A5 explained through the profile: its job asks for the 2 nodes its `gloo-cpu-slurm`
    setups' srun steps span (rules/special_studies.smk), so they run inside its allocation.
    Before: the job got 1 node, each such part failed ("Only allocated 1 nodes asked for 2") as
    "launcher exited with codes [1]", and Snakemake exited 0."""
    overlay = tmp_path / "collectives.yaml"
    setups = {"setups": ["gloo-cpu", "gloo-cpu-slurm"], "processes": [2, 4]}
    overlay.write_text(yaml.safe_dump({"special_studies": {"collectives": setups}}))
    summary = tmp_path / "studies" / "collectives" / "summary.json"
    out, seconds = on_slurm(
        tmp_path, "--configfile", ".test/config.yaml", str(overlay), "--config",
        f"results_dir={tmp_path}", "--", str(summary), timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-5000:]
    (job_id,) = re.findall(
        r"submitted with SLURM jobid (\d+) \(log: \S+/rule_collectives/", out.stderr
    )
    job = subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True
    ).stdout
    # 2 nodes, one task each with the cores of 4 ranks (cluster.cpus_per_process: 1).
    assert "NumNodes=2 " in job and "NumTasks=2 " in job and "CPUs/Task=4 " in job
    result = read_json(summary)
    assert result["status"] == "ok", result["rows"]
    slurm = [r for r in result["rows"] if r["placement"] == "slurm"]
    sizes = [4 * 16**k for k in range(6)]  # .test: 4 B to 4 MiB, by 16
    assert sorted((r["processes"], r["op"], r["size_bytes"]) for r in slurm) == sorted(
        (n, op, size) for n in (2, 4) for op in ("all_reduce", "all_gather", "reduce_scatter")
        for size in sizes
    )  # fmt: skip
    assert all(r["status"] == "ok" and r["busbw_gb_s"] > 0 for r in slurm), slurm
    host = [r for r in result["rows"] if r["placement"] == "host"]
    assert len(host) == len(slurm) and all(r["status"] == "ok" for r in host)
    assert seconds < 300


def test_in_a_1_node_job_the_slurm_sweep_is_skipped_naming_the_job(slurm_cluster):
    """Inside an allocation srun can't leave it: with 1 node the 2-node sweep can't run, and
    says why (before: srun's "Only allocated 1 nodes asked for 2" as a failed part)."""
    probe = "from dmls.special.collectives.measure import no_slurm_nodes; print(no_slurm_nodes())"
    out = subprocess.run(
        ["srun", "--nodes", "1", "--ntasks", "1", sys.executable, "-c", probe],
        env=os.environ | {"PYTHONPATH": str(ROOT / "workflow" / "scripts")},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert re.fullmatch(
        r"Slurm job \d+ has 1 node \(node[12]\), its srun steps can't span 2: submit the study "
        r"with 2 nodes \(profiles/slurm does\)\n",
        out.stdout,
    ), out.stdout
