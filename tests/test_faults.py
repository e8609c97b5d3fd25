"""Fault drills (DMLS_FAULT) through the real launchers: a dead rank ends the run quickly and
names itself; a NaN loss ends it as diverged at that epoch."""

import re
import time

import pytest

from conftest import make_spec
from dmls.files import write_json
from dmls.protocol import Fault
from dmls.supervisor import processes, supervise

DDP = dict(
    dataset="tabular", model={"name": "mlp", "hidden": 16}, device="cpu", backend="gloo",
    launcher="torchrun", nproc_per_node=2, batch_size=16, epochs=3, num_workers=0,
)  # fmt: skip
FORMAT = "'rank=<int>,epoch=<int>,kind=raise|exit|kill|nan[,run=<study>/<run>][,seed=<int>]'"


def drill(tmp_path, data_dir, monkeypatch, fault: str, **overrides):
    """Run a 2-rank DDP run under the fault `fault`; return its metrics, log and checkpoint."""
    monkeypatch.setenv("DMLS_FAULT", fault)
    spec = make_spec(run="drill", **(DDP | overrides))
    checkpoint_path = tmp_path / "checkpoints" / "drill.pt"
    with open(tmp_path / "train.log", "w") as log:
        metrics = supervise.run(
            spec, run_dir=tmp_path, data_dir=data_dir, checkpoint_path=checkpoint_path,
            log=log, threads=2,
        )  # fmt: skip
    return metrics, (tmp_path / "train.log").read_text(), checkpoint_path


def fault_time(log: str) -> float:
    return float(re.search(r"injected fault .* at unix time ([0-9.]+)", log).group(1))


@pytest.mark.parametrize("kind", ["kill", "exit"])
def test_a_dead_rank_fails_the_run_within_60_s_and_is_named(
    tmp_path, tabular_dir, monkeypatch, kind
):
    metrics, log, checkpoint_path = drill(
        tmp_path, tabular_dir, monkeypatch, f"rank=1,epoch=2,kind={kind}"
    )
    seconds_to_failure = time.time() - fault_time(log)
    print(f"{kind}: the run ended {seconds_to_failure:.1f} s after rank 1 died")
    assert seconds_to_failure < 60
    assert metrics["status"] == "failed"
    how = "was killed by SIGKILL" if kind == "kill" else "exited with code 13"
    assert metrics["reason"].startswith(
        f"rank 1 {how} without a Python error (see the end of train.log)"
    )
    assert metrics["launch"]["fault"] == f"rank=1,epoch=2,kind={kind}"
    # torchrun's summary at the end of the log says how rank 1 ended.
    assert "rank      : 1 (local_rank: 1)" in log
    assert ("Signal 9 (SIGKILL) received by PID" if kind == "kill" else "exitcode  : 13 ") in log
    # Epoch 1 finished before the fault: a rerun resumes from it.
    assert checkpoint_path.exists()


# The summary torchrun printed when rank 1 was killed and it stopped rank 0 (SIGTERM).
SUMMARY = """Failures:
[1]:
  time      : 2026-11-26_08:16:53
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4136)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4136
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-26_08:16:53
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4137)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4137
"""
LOST = "RuntimeError: [pair.cc:545] Read error [127.0.0.1]:1: Connection reset by peer"


def test_the_reason_names_the_rank_that_failed_not_the_peers_that_lost_it(tmp_path):
    def reason(*reports, output=SUMMARY):
        for path in tmp_path.glob("error-rank*.json"):
            path.unlink()
        for rank, time_s, error in reports:
            write_json(
                tmp_path / f"error-rank{rank}.json", {"rank": rank, "time": time_s, "error": error}
            )
        return processes.failure_reason(tmp_path, [1], output, "train.log")

    killed = "rank 1 was killed by SIGKILL without a Python error (see the end of train.log)"
    # Whether rank 0 noticed the lost peer before torchrun stopped it is a race: either way.
    assert reason() == killed
    assert reason((0, 5.0, LOST)) == f"{killed}; then rank 0 raised {LOST}"
    # A rank that raised is the cause even if a peer's report came first.
    fault = "InjectedFault: injected fault"
    assert reason((0, 5.0, LOST), (1, 6.0, fault), output="") == f"rank 1 raised {fault}"
    assert reason(output="") == (
        "launcher exited with codes [1] and no rank reported an error (see log)"
    )
    # Before: a rank stopped by a SIGTERM sent from outside read as the line above.
    terminated = SUMMARY.split("Root Cause")[0]
    assert reason(output=terminated) == (
        "rank 0 stopped by SIGTERM from outside the run (no rank failed before it; see the "
        "end of train.log)"
    )
    killed = processes.failure_reason(tmp_path, [-15], "", "train.log")
    assert killed == "the process was killed by SIGTERM, no rank reporting an error (see train.log)"


def test_nan_loss_on_one_rank_stops_every_rank_as_diverged_at_that_epoch(
    tmp_path, tabular_dir, monkeypatch
):
    metrics, log, checkpoint_path = drill(
        tmp_path, tabular_dir, monkeypatch, "rank=1,epoch=2,kind=nan"
    )
    assert metrics["status"] == "diverged"
    assert metrics["reason"] == "non-finite loss at epoch 2 (train nan, test nan)"
    assert metrics["final"]["diverged_epochs"] == [2]
    (seed,) = metrics["seeds"]  # its own numbers; no mean holds a diverged seed
    assert seed["final"]["epochs_completed"] == 2 and len(seed["history"]) == 2
    assert seed["history"][0]["train_loss"] > 0 and seed["history"][1]["train_loss"] is None
    assert metrics["history"] == []
    assert (tmp_path / "history.csv").read_text().count("\n") == 3
    assert "epoch 2/3  train loss nan" in log and "epoch 3/3" not in log
    assert not checkpoint_path.exists()  # the run has ended: nothing to resume


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("rank=1,epoch=1", "missing 'kind'"),
        (
            "rank=1,epoch=1,kind=segfault",
            "kind must be one of raise, exit, kill, nan, got 'segfault'",
        ),
        ("rank=one,epoch=1,kind=raise", "rank must be an integer >= 0, got 'one'"),
        ("rank=1,epoch=0,kind=raise", "epoch must be an integer >= 1, got '0'"),
        ("rank=1,epoch=1,kind=raise,when=now", "unknown key 'when'"),
        ("rank=1,rank=2,epoch=1,kind=raise", "'rank' given twice"),
        ("rank 1", "'rank 1' is not key=value"),
    ],
)
def test_fault_switch_is_parsed_strictly(value, problem):
    with pytest.raises(ValueError) as err:
        Fault.from_env({"DMLS_FAULT": value})
    assert str(err.value) == f"DMLS_FAULT={value!r}: {problem}; expected {FORMAT}"


def test_fault_switch_targets_ranks_epochs_and_runs():
    assert Fault.from_env({}) is None
    fault = Fault.from_env({"DMLS_FAULT": " epoch=2, kind=kill, rank=0, run=b/x "})
    assert fault == Fault(rank=0, epoch=2, kind="kill", run="b/x")
    assert fault.hits("b/x", 0, 2)
    assert not fault.hits("b/y", 0, 2) and not fault.hits("b/x", 1, 2)
    assert not fault.hits("b/x", 0, 1)


def test_a_drill_that_cannot_fire_is_an_error_not_a_quiet_pass(tmp_path, tabular_dir, monkeypatch):
    """Before: a drill for a rank the run lacks or an epoch it never reaches ended `ok` with
    `launch.fault: null`; a drill naming no run of the config likewise."""
    single = make_spec(run="drill", **(DDP | {"launcher": "single", "nproc_per_node": 1}))
    for value, problem in [
        ("rank=1,epoch=1,kind=raise", "rank 1, but the run has ranks 0-0"),
        ("rank=0,epoch=4,kind=raise", "epoch 4, but the run trains 3 epoch(s)"),
    ]:
        monkeypatch.setenv("DMLS_FAULT", value)
        with open(tmp_path / "train.log", "w") as log, pytest.raises(ValueError) as err:
            supervise.run(
                single, run_dir=tmp_path / "run", data_dir=tabular_dir, log=log, threads=1,
                checkpoint_path=tmp_path / "c.pt",
            )  # fmt: skip
        assert str(err.value) == (
            f"t/drill: DMLS_FAULT asks for {problem} (name the run it is for with "
            "run=<study>/<run>)"
        )
        assert not (tmp_path / "run" / "metrics.json").exists()
    # A drill for another run leaves this one alone.
    monkeypatch.setenv("DMLS_FAULT", "rank=1,epoch=9,kind=raise,run=b/x")
    fault = Fault.from_env()
    assert not fault.targets(single.run_id) and fault.cannot_fire(1, 3) == (
        "DMLS_FAULT asks for rank 1, but the run has ranks 0-0 and epoch 9, but the run trains "
        "3 epoch(s)"
    )
    fault.check_run_exists(["b/x", "b/y"])
    with pytest.raises(ValueError, match=r"names run 'b/x', which is not a run of the config "
                       r"\(did you mean 'b/xx'\?\)"):  # fmt: skip
        fault.check_run_exists(["b/xx", "c/y"])


def test_a_rank_failing_while_early_stopping_waits_resumes_to_the_same_best_weights(
    tmp_path, tabular_dir, monkeypatch
):
    """Two ranks, batch norm: early stopping sends rank 0's copy of the best weights to both
    ranks (the numbers measured again over both ranks' shards are that epoch's), the copy
    survives a rank's failure in the patience window, and the rerun ends as the uninterrupted
    run."""
    import torch

    from dmls.training import checkpoint

    stopping = dict(
        model={"name": "mlp", "hidden": 16, "batch_norm": True}, epochs=10,
        validation_samples=64, early_stopping_patience=2,
        optimizer={"name": "sgd", "lr": 0.3, "momentum": 0.9},
    )  # fmt: skip
    spec = make_spec(run="drill", **(DDP | stopping))

    def supervised(run_dir, checkpoint_path):
        run_dir.mkdir(exist_ok=True)
        with open(run_dir / "train.log", "w") as log:
            metrics = supervise.run(
                spec, run_dir=run_dir, data_dir=tabular_dir, checkpoint_path=checkpoint_path,
                log=log, threads=2,
            )  # fmt: skip
        return metrics, torch.load(run_dir / "model.pt", weights_only=True)["model"]

    reference, reference_weights = supervised(tmp_path / "reference", tmp_path / "reference.pt")
    assert reference["status"] == "ok"
    (want,) = reference["seeds"]
    best, stop = want["final"]["restored_best_epoch"], want["final"]["stopped_early_epoch"]
    assert best is not None and stop == best + 2 < 10
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
        assert want["final"][key] == want["history"][best - 1][key], key
    assert reference["final"]["test_accuracy"] == want["history"][best - 1]["test_accuracy"]

    # Rank 1 fails in the epoch it would stop at: the checkpoint holds the epoch before.
    metrics, _, checkpoint_path = drill(
        tmp_path, tabular_dir, monkeypatch, f"rank=1,epoch={stop},kind=raise", **stopping
    )
    assert metrics["status"] == "failed"
    state, _ = checkpoint.load(checkpoint_path, checkpoint.read_identity(checkpoint_path))
    assert state["epoch"] == stop - 1 and state["progress"]["best_epoch"] == best
    monkeypatch.delenv("DMLS_FAULT")
    resumed, weights = supervised(tmp_path, checkpoint_path)
    assert resumed["status"] == "ok" and resumed["seeds"][0]["resumed_from_epoch"] == stop - 1
    assert resumed["seeds"][0]["final"] == want["final"]
    for got, row in zip(resumed["history"], reference["history"], strict=True):
        for key in ("train_loss", "val_loss", "test_loss", "test_accuracy", "lr"):
            assert got[key] == row[key], (got["epoch"], key)
    assert weights.keys() == reference_weights.keys()
    for key, tensor in weights.items():
        assert torch.equal(tensor, reference_weights[key]), key
    # Measured again on both ranks, the restored weights gave that epoch's numbers exactly.
    said = f"early stopping: restored the weights of epoch {best}, the lowest validation loss\n"
    assert said in (tmp_path / "train.log").read_text()
