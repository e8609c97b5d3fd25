"""A run's seeds in one job (config `seeds`): independent, resumable one by one, combined."""

import pytest

from conftest import make_spec
from dmls import record
from dmls.supervisor import supervise

EPOCH_KEYS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "lr")
DDP = dict(
    dataset="tabular", model={"name": "mlp", "hidden": 16}, device="cpu", backend="gloo",
    launcher="torchrun", nproc_per_node=2, batch_size=32, epochs=3, num_workers=0,
)  # fmt: skip


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory):
    from dmls.data import datasets

    out = tmp_path_factory.mktemp("images")
    datasets.prepare("synthetic_cifar", {"n_train": 64, "n_test": 32, "seed": 0}, out)
    return out


def epochs(seed: dict) -> list[tuple]:
    return [tuple(row[k] for k in EPOCH_KEYS) for row in seed["history"]]


@pytest.mark.parametrize("path", ["workers", "augmented"])
def test_each_seed_of_a_job_equals_a_job_that_trains_that_seed_alone(
    tmp_path, tabular_dir, images_dir, path
):
    """Data order, weights, augmentation and DataLoader workers' streams all restart from the
    seed: nothing of seed 0 leaks into seed 1 (CPU, bitwise)."""
    from dmls.training import job as trainer

    if path == "workers":  # the course's DataLoader, with a worker process drawing its seed
        settings = dict(dataset="tabular", model={"name": "mlp", "hidden": 8}, loader="torch",
                        num_workers=1)  # fmt: skip
        data_dir = tabular_dir
    else:  # random crops and flips drawn on the device path
        settings = dict(
            dataset="synthetic_cifar", loader="device", num_workers=0,
            model={"name": "cnn", "conv_channels": [4], "fc_hidden": 8, "batch_norm": True},
            augment={"random_crop": True, "horizontal_flip": True},
        )  # fmt: skip
        data_dir = images_dir
    spec = make_spec(device="cpu", epochs=2, batch_size=16, seed=5, seeds=2, **settings)
    (tmp_path / "job").mkdir()
    job = trainer.train(spec, data_dir, tmp_path / "job", tmp_path / "job.pt")
    assert [s["seed"] for s in job["seeds"]] == [5, 6]
    for seed, alone_spec in zip(job["seeds"], spec.seed_specs(), strict=True):
        (tmp_path / f"alone{alone_spec.seed}").mkdir()
        alone = trainer.train(
            alone_spec, data_dir, tmp_path / f"alone{alone_spec.seed}", tmp_path / "alone.pt"
        )
        assert epochs(seed) == epochs(alone["seeds"][0])
        assert (tmp_path / "job" / f"model-seed{alone_spec.seed}.pt").exists()
    # ... and the two seeds are not the same run twice.
    first, second = job["seeds"]
    assert epochs(first)[0] != epochs(second)[0]


def test_no_earlier_seed_is_alive_when_the_next_seed_starts(tmp_path, tabular_dir, monkeypatch):
    """An earlier seed's trainer and model (on a GPU: its gradients, optimizer state and CUDA
    graph pool) are gone before the next seed resets its peak memory, even where only the
    garbage collector could free them (it is off here: the job must collect them itself)."""
    import gc
    import weakref

    from dmls.training import job as trainer

    earlier, alive_at_start = [], []

    class Watched(trainer.Trainer):
        def __init__(self, *args, **kwargs):
            alive_at_start.append([name for name, ref in earlier if ref() is not None])
            super().__init__(*args, **kwargs)
            earlier.extend([("trainer", weakref.ref(self)), ("model", weakref.ref(self.model))])

    monkeypatch.setattr(trainer, "Trainer", Watched)
    spec = make_spec(device="cpu", epochs=1, batch_size=64, seeds=3, dataset="tabular",
                     model={"name": "mlp", "hidden": 8}, num_workers=0)  # fmt: skip
    (tmp_path / "job").mkdir()
    gc.disable()
    try:
        job = trainer.train(spec, tabular_dir, tmp_path / "job", tmp_path / "job.pt")
    finally:
        gc.enable()
    assert [s["status"] for s in job["seeds"]] == ["ok"] * 3
    assert alive_at_start == [[], [], []]


def test_throughput_is_the_steady_epochs_not_the_warm_up_s():
    from dmls.record import epoch_times, throughput

    # Seed 0 of a graph-step run: the first epoch captures the graph.
    warm = epoch_times([{"train_time_s": t} for t in (6.6, 0.20, 0.18)])
    assert throughput(15000, warm) == pytest.approx(15000 / 0.19)
    # One epoch: there is no steady one, so that epoch's.
    assert throughput(15000, epoch_times([{"train_time_s": 3.0}])) == pytest.approx(5000)
    assert throughput(15000, epoch_times([])) is None


def test_a_job_killed_during_seed_2_keeps_seed_1_and_resumes_seed_2(
    tmp_path, tabular_dir, monkeypatch
):
    spec = make_spec(run="seeds", seeds=2, **DDP)
    checkpoint = tmp_path / "checkpoints" / "seeds.pt"

    def job(name: str) -> dict:
        run_dir = tmp_path / name
        run_dir.mkdir(exist_ok=True)
        with open(run_dir / "train.log", "w") as log:
            return supervise.run(
                spec, run_dir=run_dir, data_dir=tabular_dir, log=log, threads=2,
                checkpoint_path=checkpoint if name == "killed" else tmp_path / f"{name}.pt",
            )  # fmt: skip

    # Rank 1 is killed (SIGKILL, as by the OOM killer) halfway through epoch 2 of seed 1, the
    # job's second seed: the run fails, and its checkpoints stay for the rerun.
    monkeypatch.setenv("DMLS_FAULT", "rank=1,epoch=2,kind=kill,seed=1")
    failed = job("killed")
    assert failed["status"] == "failed" and "rank 1 was killed by SIGKILL" in failed["reason"]
    seed0, seed1 = spec.seed_checkpoints(checkpoint)
    assert seed0.exists() and seed1.exists()
    kept_bytes = seed0.read_bytes()

    monkeypatch.delenv("DMLS_FAULT")
    resumed = job("killed")
    log = (tmp_path / "killed" / "train.log").read_text()
    assert "seed 0 finished in an earlier attempt: kept" in log
    assert f"resuming from checkpoint {seed1}: 1 epoch(s) finished" in log
    first, second = resumed["seeds"]
    assert first["kept"] and first["resumed_from_epoch"] == 0
    assert not second["kept"] and second["resumed_from_epoch"] == 1
    assert not seed0.exists() and not seed1.exists()  # the run has ended
    assert kept_bytes  # (seed 0's file was there, untouched, until then)

    reference = job("reference")
    assert resumed["status"] == reference["status"] == "ok"
    for got, want in zip(resumed["seeds"], reference["seeds"], strict=True):
        assert epochs(got) == epochs(want)
    assert resumed["final"] == reference["final"]
    assert resumed["summary"]["test_accuracy"] == reference["summary"]["test_accuracy"]

    # The files of the run: a model per seed, and every seed's epochs in history.csv.
    run_dir = tmp_path / "killed"
    assert sorted(p.name for p in run_dir.glob("model*.pt")) == ["model-seed0.pt", "model-seed1.pt"]
    rows = (run_dir / "history.csv").read_text().splitlines()
    assert rows[0].startswith("seed,epoch,") and len(rows) == 1 + 2 * 3
    metrics = record.read(run_dir / "metrics.json")
    assert record.seed_count(metrics) == 2 and metrics["summary"]["test_accuracy"]["n"] == 2


def test_a_drill_for_a_seed_the_run_does_not_train_is_an_error(tmp_path, tabular_dir, monkeypatch):
    monkeypatch.setenv("DMLS_FAULT", "rank=0,epoch=1,kind=raise,seed=7")
    spec = make_spec(run="seeds", seeds=2, **DDP)
    with (
        open(tmp_path / "train.log", "w") as log,
        pytest.raises(ValueError, match=r"seed 7, but the run trains seeds \[0, 1\]"),
    ):
        supervise.run(
            spec, run_dir=tmp_path, data_dir=tabular_dir, log=log, threads=2,
            checkpoint_path=tmp_path / "c.pt",
        )  # fmt: skip
