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
                "seeds": 1,  # (a job's seeds, killed and resumed: tests/test_repeats.py)
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
    killed_after = checkpoint.load(checkpoint_path, checkpoint.read_identity(checkpoint_path))[0][
        "epoch"
    ]
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
    assert resumed["status"] == "ok" and resumed["seeds"][0]["resumed_from_epoch"] == killed_after
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
    assert reference["seeds"][0]["resumed_from_epoch"] == 0
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


KEY = {"spec_sha256": "s" * 64, "data_sha256": "d" * 64, "torch": torch.__version__}


def test_a_checkpoint_resumes_only_its_spec_data_and_torch_version(tmp_path):
    path = tmp_path / "run.pt"
    spec = make_spec(epochs=3)
    key = checkpoint.identity(spec, {"sha256": "d" * 64})
    assert key == {
        "spec_sha256": checkpoint.spec_hash(spec), "data_sha256": "d" * 64,
        "torch": torch.__version__,
    }  # fmt: skip
    checkpoint.save(path, key, {"epoch": 2})
    state, note = checkpoint.load(path, key)
    assert state["epoch"] == 2 and note == f"resuming from checkpoint {path}: 2 epoch(s) finished"
    changed = checkpoint.identity(make_spec(epochs=3, optimizer={"lr": 0.5}), {"sha256": "d" * 64})
    assert checkpoint.load(path, changed) == (
        None,
        f"ignoring checkpoint {path}: it was written for another spec_sha256 "
        f"({key['spec_sha256']}; this run's {changed['spec_sha256']}); starting from epoch 1",
    )
    other_data = key | {"data_sha256": "e" * 64}
    state, note = checkpoint.load(path, other_data)
    assert state is None and f"another data_sha256 ({'d' * 64}; this run's {'e' * 64})" in note
    assert path.exists()  # another run's checkpoint is left alone, not set aside


def test_a_run_resumes_across_a_data_change_from_epoch_1(tmp_path, tabular_dir):
    """The repro: the same spec, its dataset prepared again from other rows, must not resume
    the checkpoint the old rows wrote."""
    from dmls.data import datasets
    from dmls.training import job as trainer

    spec = make_spec(
        dataset="tabular", model={"name": "mlp", "hidden": 8}, device="cpu", epochs=2,
        batch_size=64, num_workers=0,
    )  # fmt: skip
    path = tmp_path / "run.pt"
    (first,) = trainer.train(spec, tabular_dir, tmp_path, path)["seeds"]
    assert first["resumed_from_epoch"] == 0 and path.exists()
    # The job ended before its result was written: the finished seed is kept as it was.
    (again,) = trainer.train(spec, tabular_dir, tmp_path, path)["seeds"]
    assert again == first | {"kept": True}
    other = tmp_path / "other"
    cfg = {"dir": None, "synthetic": {"n_train": 256, "n_test": 100, "seed": 1}}
    datasets.prepare("tabular", cfg, other)
    (changed,) = trainer.train(spec, other, tmp_path, path)["seeds"]
    assert changed["resumed_from_epoch"] == 0 and not changed["kept"]
    assert changed["history"][0]["train_loss"] != first["history"][0]["train_loss"]


def written(tmp_path) -> tuple[Path, bytes]:
    path = tmp_path / "run.pt"
    checkpoint.save(path, KEY, {"epoch": 1, "weights": torch.arange(40_000.0)})
    return path, path.read_bytes()


@pytest.mark.parametrize("damage", ["zeroed", "0x7f", "truncated"])
def test_a_damaged_checkpoint_is_set_aside_never_resumed(tmp_path, damage):
    path, raw = written(tmp_path)
    payload_start = raw.index(b"\n") + 1
    middle = payload_start + (len(raw) - payload_start) // 2
    if damage == "zeroed":  # one 64 KiB stretch zeroed, as a damaged disk block would be
        raw = raw[:middle] + bytes(min(65536, len(raw) - middle)) + raw[middle + 65536 :]
    elif damage == "0x7f":
        raw = raw[:middle] + b"\x7f" * 4096 + raw[middle + 4096 :]
    else:
        raw = raw[:middle]
    path.write_bytes(raw)
    state, note = checkpoint.load(path, KEY, set_aside=False)
    assert state is None and path.exists()  # a rank that doesn't set it aside leaves it
    state, note = checkpoint.load(path, KEY)
    (aside,) = tmp_path.glob("run.pt.damaged-*")
    assert state is None and not path.exists() and aside.read_bytes() == raw
    assert note.startswith(f"checkpoint {path} is damaged (")
    assert note.endswith(f"it is not resumed: moved to {aside}, starting from epoch 1")
    assert checkpoint.load(path, KEY)[0] is None  # the next attempt starts afresh


def test_checkpoints_load_tensors_and_plain_data_only(tmp_path):
    """Even a file whose header and digest are in order unpickles plain data only."""
    import hashlib
    import io
    import json

    buffer = io.BytesIO()
    torch.save({"epoch": 1, "payload": Path("/etc/passwd")}, buffer)
    payload = buffer.getvalue()
    header = {"format": checkpoint.FORMAT_VERSION, "identity": KEY, "payload_bytes": len(payload),
              "payload_sha256": hashlib.sha256(payload).hexdigest()}  # fmt: skip
    path = tmp_path / "evil.pt"
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload)
    state, note = checkpoint.load(path, KEY)
    assert state is None and "is damaged (UnpicklingError: Weights only load failed" in note


def test_a_full_disk_while_checkpointing_says_so_and_keeps_the_last_checkpoint(
    tmp_path, monkeypatch
):
    import errno

    path, raw = written(tmp_path)

    def full(target, write):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "atomic_write", full)
    with pytest.raises(checkpoint.DiskFull) as caught:
        checkpoint.save(path, KEY, {"epoch": 3})
    assert caught.value.errno == errno.ENOSPC and caught.value.resumable
    message = str(caught.value)
    assert f"no space left on the device writing checkpoint {path} (" in message
    assert "MiB free there): free space, then rerun; the run resumes after epoch 2" in message
    assert path.read_bytes() == raw


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    import random

    import numpy as np

    cpu = torch.device("cpu")
    state = checkpoint.rng_state(cpu)
    checkpoint.save(tmp_path / "rng.pt", KEY, {"epoch": 1, "rng": [state]})
    expected = random.random(), np.random.rand(), torch.rand(3)
    loaded, _ = checkpoint.load(tmp_path / "rng.pt", KEY)
    checkpoint.set_rng_state(loaded["rng"][0], cpu)
    assert random.random() == expected[0] and np.random.rand() == expected[1]
    assert torch.equal(torch.rand(3), expected[2])


def test_a_rank_stopped_by_a_full_disk_fails_the_job_and_leaves_the_run_resumable(
    tmp_path, tabular_dir, monkeypatch
):
    """What the supervisor makes of a rank's DiskFull: no failed metrics.json (which would end
    the run for Snakemake), a job that fails with the reason, and the checkpoint kept."""
    from dmls.files import write_json

    spec = make_spec(dataset="tabular", model={"name": "mlp"}, device="cpu")
    checkpoint_path, _ = written(tmp_path)
    run_dir = tmp_path / "run"
    reason = "DiskFull: [Errno 28] no space left on the device writing checkpoint x.pt"

    def launched(commands, log, reservation=None, heartbeat=None):
        write_json(run_dir / "error-rank0.json",
                   {"rank": 0, "time": 1.0, "error": reason, "resumable": True})  # fmt: skip
        return [1], 0.5, 1

    monkeypatch.setattr(supervise, "_start_and_wait", launched)
    with open(tmp_path / "train.log", "w") as log, pytest.raises(supervise.RunInterrupted) as e:
        supervise.run(
            spec, run_dir=run_dir, data_dir=tabular_dir, checkpoint_path=checkpoint_path,
            log=log, threads=1,
        )  # fmt: skip
    assert str(e.value) == (
        f"{spec.run_id}: rank 0 stopped: {reason}. That is no result, so none is recorded: "
        "rerun the workflow once that is fixed"
    )
    assert not (run_dir / "metrics.json").exists() and checkpoint_path.exists()


def test_a_run_another_workflow_is_training_into_the_same_folder_is_refused(tmp_path, tabular_dir):
    """Before: two clones with one results_dir trained the same run at once, and one resumed
    from the other's checkpoint."""
    from filelock import FileLock

    spec = make_spec(dataset="tabular", model={"name": "mlp"}, device="cpu", epochs=1)
    checkpoint_path = tmp_path / "checkpoints" / "r.pt"
    checkpoint_path.parent.mkdir()
    other = FileLock(str(checkpoint_path) + ".lock")
    with other, open(tmp_path / "train.log", "w") as log, pytest.raises(supervise.RunBusy) as e:
        supervise.run(
            spec, run_dir=tmp_path / "run", data_dir=tabular_dir, log=log, threads=1,
            checkpoint_path=checkpoint_path,
        )  # fmt: skip
    assert str(e.value) == (
        f"t/r is being trained by another workflow into the same results folder (it holds "
        f"{checkpoint_path}.lock); let that one finish, or give this checkout its own results_dir"
    )
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_the_losing_workflow_leaves_the_winners_log_and_files_as_they_were(tmp_path):
    """Two clones on one results_dir: the loser failed with RunBusy as it should, but had
    truncated train.log first, so the winner's finished run kept only the loser's traceback."""
    from types import SimpleNamespace

    from filelock import FileLock

    spec = make_spec(dataset="tabular", model={"name": "mlp"}, device="cpu", epochs=1)
    run_dir = tmp_path / "runs" / "t" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "train.log").write_text("the winner's log\n")
    (run_dir / "history.csv").write_text("seed,epoch\n0,1\n")
    job = SimpleNamespace(
        params=SimpleNamespace(spec=spec.to_json()),
        output=SimpleNamespace(metrics=str(run_dir / "metrics.json")),
        input=SimpleNamespace(manifest=str(tmp_path / "data" / "tabular.json")),
        log=[str(run_dir / "train.log")],
        threads=1,
        config={"results_dir": str(tmp_path), "strict": False, "isolation": "none",
                "runtime": supervise.DEFAULT_RUNTIME},
    )  # fmt: skip
    checkpoint_path = spec.checkpoint_path(tmp_path)
    checkpoint_path.parent.mkdir(parents=True)
    with FileLock(str(checkpoint_path) + ".lock"), pytest.raises(supervise.RunBusy):
        supervise.main_from_snakemake(job)
    assert (run_dir / "train.log").read_text() == "the winner's log\n"
    assert (run_dir / "history.csv").exists()


def test_the_writer_writes_what_the_state_was_when_submitted_one_write_at_a_time(
    tmp_path, monkeypatch
):
    """Training goes on while a checkpoint is written: the writer copies the state's tensors
    at submit (a weight changed in place afterwards is not what lands), writes in order with
    at most one write in flight, and flush waits for it."""
    import threading

    real_save, release, events = checkpoint.save, threading.Event(), []

    def slow_save(path, key, state):
        events.append(("start", state["epoch"]))
        assert release.wait(10)
        real_save(path, key, state)
        events.append(("end", state["epoch"]))

    monkeypatch.setattr(checkpoint, "save", slow_save)
    writer = checkpoint.Writer()
    weights = torch.arange(4.0)
    writer.submit(tmp_path / "run.pt", KEY, {"epoch": 1, "weights": weights, "step": 7})
    weights.add_(100.0)  # the next epoch trains meanwhile
    threading.Timer(0.2, release.set).start()
    writer.submit(tmp_path / "run.pt", KEY, {"epoch": 2, "weights": weights, "step": 8})
    assert events[:2] == [("start", 1), ("end", 1)]  # the second waited for the first
    writer.close()
    assert events == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    state, _ = checkpoint.load(tmp_path / "run.pt", KEY)
    assert state["epoch"] == 2 and state["weights"].tolist() == [100.0, 101.0, 102.0, 103.0]


def test_the_writer_stages_its_own_copy_and_raises_a_write_error_at_the_next_call(
    tmp_path, monkeypatch
):
    import errno
    import threading

    release = threading.Event()
    real_save = checkpoint.save

    def held_save(path, key, state):
        assert release.wait(10)
        real_save(path, key, state)

    monkeypatch.setattr(checkpoint, "save", held_save)
    writer = checkpoint.Writer()
    weights = torch.zeros(3)
    writer.submit(tmp_path / "run.pt", KEY, {"epoch": 1, "optimizer": {"state": [weights]}})
    weights.fill_(5.0)
    release.set()
    writer.flush()
    state, _ = checkpoint.load(tmp_path / "run.pt", KEY)
    assert state["optimizer"]["state"][0].tolist() == [0.0, 0.0, 0.0]

    def full(target, write):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save", real_save)
    monkeypatch.setattr(checkpoint, "atomic_write", full)
    writer.submit(tmp_path / "run.pt", KEY, {"epoch": 2})
    with pytest.raises(checkpoint.DiskFull, match="the run resumes after epoch 1"):
        writer.flush()
    writer.flush()  # reported once
    writer.close()


def test_a_full_disk_during_training_fails_the_run_and_keeps_the_last_checkpoint(
    tabular_dir, tmp_path, monkeypatch
):
    """The epochs' checkpoints are written on the writer's thread: a full disk there still
    ends the run with DiskFull, and the checkpoint before it stays on disk to resume."""
    import errno

    from dmls.training import job as trainer

    real_write, writes = checkpoint.atomic_write, []

    def full_at_the_second(target, write):
        writes.append(target)
        if len(writes) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(target, write)

    monkeypatch.setattr(checkpoint, "atomic_write", full_at_the_second)
    spec = make_spec(
        dataset="tabular", model={"name": "mlp", "hidden": 8}, device="cpu", epochs=3,
        batch_size=64, num_workers=0,
    )  # fmt: skip
    path = tmp_path / "run.pt"
    with pytest.raises(checkpoint.DiskFull, match="the run resumes after epoch 1"):
        trainer.train(spec, tabular_dir, tmp_path, path)
    state, _ = checkpoint.load(path, checkpoint.read_identity(path))
    assert state["epoch"] == 1


class Killed(Exception):
    """The job dies here (as a `kill -9` would, after the last checkpoint landed)."""


def test_a_run_killed_while_early_stopping_waits_resumes_to_the_same_best_weights(
    tmp_path, tabular_dir, monkeypatch, capsys
):
    """The weights early stopping goes back to are in the checkpoint: a run killed in its
    patience window (its last checkpoint's weights are not the best), or after it stopped and
    before it went back to them, ends as the uninterrupted run, the same weights included. A
    checkpoint written before checkpoints kept them starts the run afresh."""
    from dmls.training import job
    from dmls.training.trainer import Trainer

    spec = make_spec(
        dataset="tabular", model={"name": "mlp", "hidden": 16, "batch_norm": True},
        device="cpu", epochs=10, batch_size=32, num_workers=0, validation_samples=64,
        optimizer={"name": "sgd", "lr": 0.3, "momentum": 0.9}, early_stopping_patience=2,
    )  # fmt: skip

    def train(name: str) -> tuple[dict, dict]:
        run_dir = tmp_path / name
        run_dir.mkdir(exist_ok=True)
        (seed,) = job.train(spec, tabular_dir, run_dir, tmp_path / f"{name}.pt")["seeds"]
        return seed, torch.load(run_dir / "model.pt", weights_only=True)["model"]

    want, want_weights = train("reference")
    best, stop = want["final"]["restored_best_epoch"], want["final"]["stopped_early_epoch"]
    assert best is not None and stop == best + 2 < spec.epochs

    def same_as_the_reference(seed: dict, weights: dict) -> None:
        assert seed["final"] == want["final"]
        for got, row in zip(seed["history"], want["history"], strict=True):
            for key in ("train_loss", "val_loss", "test_loss", "test_accuracy", "lr"):
                assert got[key] == row[key], (got["epoch"], key)
        assert weights.keys() == want_weights.keys()
        for key, tensor in weights.items():  # BatchNorm's running statistics included
            assert torch.equal(tensor, want_weights[key]), key

    # 1. Killed during the epoch it stops at: its last checkpoint is the one before, a
    #    patience epoch, whose weights are not the best.
    real_train_epoch = Trainer.train_epoch

    def killed_at_the_stop(self, epoch):
        if epoch + 1 == stop:
            raise Killed
        return real_train_epoch(self, epoch)

    monkeypatch.setattr(Trainer, "train_epoch", killed_at_the_stop)
    with pytest.raises(Killed):
        train("window")
    monkeypatch.undo()
    path = tmp_path / "window.pt"
    key = checkpoint.read_identity(path)
    state, _ = checkpoint.load(path, key)
    assert state["epoch"] == stop - 1 and state["progress"]["best_epoch"] == best
    assert not torch.equal(state["model"]["net.0.weight"], state["best_model"]["net.0.weight"])
    seed, weights = train("window")
    assert seed["resumed_from_epoch"] == stop - 1
    same_as_the_reference(seed, weights)

    # 2. Killed after its last epoch's checkpoint, before it went back to the best weights:
    #    the rerun trains no epoch, and goes back to them from the checkpoint.
    def killed_before_going_back(self, progress):
        raise Killed

    monkeypatch.setattr(Trainer, "_restore_best", killed_before_going_back)
    with pytest.raises(Killed):
        train("stopped")
    monkeypatch.undo()
    state, _ = checkpoint.load(tmp_path / "stopped.pt", key)
    assert state["epoch"] == state["progress"]["stopped_early_epoch"] == stop
    seed, weights = train("stopped")
    assert seed["resumed_from_epoch"] == stop
    same_as_the_reference(seed, weights)

    # 3. A checkpoint without the best weights (written before they were kept) is not resumed.
    old = tmp_path / "old.pt"
    checkpoint.save(old, key, {k: v for k, v in state.items() if k != "best_model"})
    capsys.readouterr()
    seed, weights = train("old")
    assert seed["resumed_from_epoch"] == 0
    assert (
        f"ignoring checkpoint {old}: it holds no best weights for early stopping to go back to "
        "(written before checkpoints kept them); starting from epoch 1"
    ) in capsys.readouterr().out
    same_as_the_reference(seed, weights)
