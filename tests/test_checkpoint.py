"""Resume: `kill -9` of torchrun mid-run, then the DAG again, ends where an uninterrupted run
ends, bit for bit; a checkpoint never resumes another spec."""

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from snakemake.utils import update_config

from conftest import ROOT, make_spec, validated
from dmls.config.spec import resolve_runs
from dmls.supervisor import supervise
from dmls.training import checkpoint

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
# Two more runs of B1 (2-rank DDP on CPU, over config/config.yaml). Batch norm, Adam with
# OneCycle, fp16 with its GradScaler: every kind of state a checkpoint holds. Epochs long
# enough (64 steps) to be killed in the middle.
CONFIG = {
    "isolation": "none",
    "data": {"tabular": {"synthetic": {"n_train": 1024, "n_test": 256, "seed": 0}}},
    "studies": {
        "cluster_torchrun": {
            "base": {
                "nproc_per_node": 2, "precision": "fp16", "batch_size": 8, "epochs": 3,
                "optimizer": {"lr": 0.003}, "scheduler": {"name": "onecycle", "max_lr": 0.003},
            },
            "runs": {"resumed": {}, "dead_rank": {}},
        }
    },
}  # fmt: skip
RUN_ID = "cluster_torchrun/resumed"
DEAD_RANK = "cluster_torchrun/dead_rank"


def snakemake(config_file: Path, results: Path, **env: str) -> subprocess.Popen:
    """The DAG of these two runs (the other B1 runs are left out)."""
    targets = [str(results / "runs" / r / "metrics.json") for r in (RUN_ID, DEAD_RANK)]
    return subprocess.Popen(
        [SNAKEMAKE, *targets, "--cores", "2", "--keep-going", "--rerun-incomplete",
         "--configfile", str(config_file)],
        cwd=ROOT, env=os.environ | env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def torchrun_agent(dag: subprocess.Popen, run_dir: Path) -> psutil.Process:
    """The torchrun agent of the run in `run_dir`, once Snakemake has started it."""
    while True:
        for proc in psutil.Process(dag.pid).children(recursive=True):
            try:
                argv = proc.cmdline()
            except psutil.Error:  # gone meanwhile
                continue
            if "torch.distributed.run" in argv and f"--run-dir {run_dir} " in " ".join(argv):
                return proc
        assert dag.poll() is None, dag.stdout.read()
        time.sleep(0.05)


def test_kill_9_of_torchrun_mid_run_then_the_dag_again_equals_an_uninterrupted_run(tmp_path):
    results = tmp_path / "results"
    config = copy.deepcopy(CONFIG) | {"results_dir": str(results)}
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    run_dir = results / "runs" / RUN_ID
    checkpoint_path = results / "checkpoints" / f"{RUN_ID}.pt"

    # 1. The DAG starts both runs; one rank of `dead_rank` raises, `resumed` is killed -9
    #    right after its first checkpoint, in the middle of its next epoch.
    dag = snakemake(config_file, results, DMLS_FAULT=f"run={DEAD_RANK},rank=1,epoch=1,kind=raise")
    agent = torchrun_agent(dag, run_dir)
    while not checkpoint_path.exists():
        assert agent.is_running(), "the run ended before it could be killed"
        time.sleep(0.01)
    os.killpg(agent.pid, signal.SIGKILL)
    killed_after = torch.load(checkpoint_path, weights_only=True)["epoch"]
    output = dag.communicate(timeout=300)[0]
    assert dag.returncode != 0
    assert (
        f"{RUN_ID}: a launcher was killed by SIGKILL from outside the run (kill, preemption, "
        "OOM killer). That is no result, so none is recorded: rerun the workflow and the run "
        f"resumes from its last finished epoch ({checkpoint_path})"
    ) in output
    assert not (run_dir / "metrics.json").exists()
    # Under --keep-going the rest of the DAG went on: the dead rank's run is recorded.
    dead = json.loads((results / "runs" / DEAD_RANK / "metrics.json").read_text())
    assert dead["status"] == "failed"
    assert dead["reason"] == (
        "rank 1 raised InjectedFault: injected fault (DMLS_FAULT): rank 1, epoch 1, kind raise"
    )
    dead_log = (results / "runs" / DEAD_RANK / "train.log").read_text()
    assert "[rank1]: Traceback (most recent call last):" in dead_log
    assert "[rank1]: dmls.training.faults.InjectedFault: injected fault (DMLS_FAULT)" in dead_log

    # 2. The same DAG again: the killed run resumes from its last finished epoch.
    dag = snakemake(config_file, results)
    output = dag.communicate(timeout=300)[0]
    assert dag.returncode == 0, output
    resumed = json.loads((run_dir / "metrics.json").read_text())
    assert resumed["status"] == "ok" and resumed["resumed_from_epoch"] == killed_after
    assert 1 <= killed_after < 3
    assert f"resuming from checkpoint {checkpoint_path}: {killed_after} epoch(s) finished" in (
        (run_dir / "train.log").read_text()
    )
    assert not checkpoint_path.exists()  # the run has ended

    # 3. The same run, never interrupted, in the same setting (1 thread, as in the DAG).
    merged = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    update_config(merged, config)  # as `--configfile` does
    spec = resolve_runs(validated(merged))[RUN_ID]
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    with open(reference_dir / "train.log", "w") as log:
        reference = supervise.run(
            spec, run_dir=reference_dir, data_dir=results / "data",
            checkpoint_path=tmp_path / "reference.pt", log=log, threads=1,
        )  # fmt: skip
    assert reference["resumed_from_epoch"] == 0
    print(f"killed after epoch {killed_after}; final {resumed['final']} vs {reference['final']}")
    # Bitwise: same data order, same RNG streams, same reductions, restored exactly.
    assert resumed["final"] == reference["final"]
    for got, want in zip(resumed["history"], reference["history"], strict=True):
        for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "lr"):
            assert got[key] == want[key], (got["epoch"], key)
    weights = torch.load(run_dir / "model.pt", weights_only=True)["model"]
    reference_weights = torch.load(reference_dir / "model.pt", weights_only=True)["model"]
    assert weights.keys() == reference_weights.keys()
    for key, tensor in weights.items():
        assert torch.equal(tensor, reference_weights[key]), key


def test_a_checkpoint_of_another_spec_is_ignored(tmp_path):
    path = tmp_path / "run.pt"
    spec = make_spec(epochs=3)
    checkpoint.save(path, spec, {"epoch": 2})
    state, note = checkpoint.load(path, spec)
    assert state["epoch"] == 2 and note == f"resuming from checkpoint {path}: 2 epoch(s) finished"
    changed = make_spec(epochs=3, optimizer={"lr": 0.5})
    state, note = checkpoint.load(path, changed)
    assert state is None
    assert note == (
        f"ignoring checkpoint {path}: it was written for another spec or format (spec sha256 "
        f"{checkpoint.spec_hash(spec)}, this run's {checkpoint.spec_hash(changed)}); "
        "starting from epoch 1"
    )
    assert checkpoint.spec_hash(spec) != checkpoint.spec_hash(changed)


def test_checkpoints_load_tensors_and_plain_data_only(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": checkpoint.FORMAT_VERSION, "payload": Path("/etc/passwd")}, path)
    with pytest.raises(RuntimeError, match=r"evil\.pt can't be read \(UnpicklingError: Weights"):
        checkpoint.load(path, make_spec())


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    import random

    import numpy as np

    cpu = torch.device("cpu")
    state = checkpoint.rng_state(cpu)
    checkpoint.save(tmp_path / "rng.pt", make_spec(), {"epoch": 1, "rng": [state]})
    expected = random.random(), np.random.rand(), torch.rand(3)
    loaded, _ = checkpoint.load(tmp_path / "rng.pt", make_spec())
    checkpoint.set_rng_state(loaded["rng"][0], cpu)
    assert random.random() == expected[0] and np.random.rand() == expected[1]
    assert torch.equal(torch.rand(3), expected[2])
