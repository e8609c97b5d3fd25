"""Sharded data parallelism (config `sharding`): ZeRO-1 through torch's ZeroRedundancyOptimizer,
ZeRO-2 and ZeRO-3 through FSDP2, each a strategy of the engine (training/parallel.py), on the CPU
with Gloo."""

import io
import time

import pytest

from conftest import make_spec
from dmls.config.spec import SpecError
from dmls.supervisor import supervise

EPOCH_KEYS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "lr")
WIDE = dict(
    dataset="tabular", model={"name": "wide_mlp", "hidden": 32, "layers": 2}, device="cpu",
    backend="gloo", launcher="torchrun", nproc_per_node=2, batch_size=16, epochs=3,
    num_workers=0, optimizer={"name": "adamw", "lr": 1e-3, "weight_decay": 0.01},
    scheduler={"name": "onecycle", "max_lr": 1e-3},  # cycles Adam's beta1: ZeRO must expose it
)  # fmt: skip


def job(spec, tmp_path, tabular_dir, name: str, checkpoint=None) -> dict:
    run_dir = tmp_path / name
    run_dir.mkdir(exist_ok=True)
    with open(run_dir / "train.log", "w") as log:
        return supervise.run(
            spec, run_dir=run_dir, data_dir=tabular_dir, log=log, threads=2,
            checkpoint_path=checkpoint or tmp_path / f"{name}.pt",
        )  # fmt: skip


def epochs(result: dict) -> list[float]:
    """Every epoch's losses, accuracies and learning rate, one flat list."""
    return [row[k] for row in result["seeds"][0]["history"] for k in EPOCH_KEYS]


@pytest.fixture(scope="module")
def ddp(tmp_path_factory, tabular_dir):
    tmp = tmp_path_factory.mktemp("ddp")
    return job(make_spec(run="ddp", **WIDE), tmp, tabular_dir, "ddp")


@pytest.mark.parametrize("sharding", ["optimizer", "gradients", "full"])
def test_each_sharding_learns_what_ddp_learns(tmp_path, tabular_dir, ddp, sharding):
    """The same model, data and AdamW: sharding changes where the state lives, not the
    arithmetic (up to the order of float sums in the reductions)."""
    got = job(make_spec(run=sharding, sharding=sharding, **WIDE), tmp_path, tabular_dir, sharding)
    assert got["status"] == ddp["status"] == "ok"
    assert epochs(got) == pytest.approx(epochs(ddp), rel=1e-5, abs=1e-6)
    step = got["seeds"][0]["step"]
    assert step["mode"] == "eager"
    assert (tmp_path / sharding / "model.pt").exists()


@pytest.mark.parametrize("sharding", ["optimizer", "full"])
def test_a_sharded_run_killed_mid_epoch_resumes_to_the_uninterrupted_numbers(
    tmp_path, tabular_dir, ddp, monkeypatch, sharding
):
    """The checkpoint gathers the shards onto rank 0 (ZeRO's consolidate_state_dict, the
    distributed checkpoint's full state dicts) and the rerun scatters them back."""
    import torch

    spec = make_spec(run=sharding, sharding=sharding, **WIDE)
    checkpoint = tmp_path / "checkpoints" / f"{sharding}.pt"
    monkeypatch.setenv("DMLS_FAULT", "rank=1,epoch=2,kind=kill")
    failed = job(spec, tmp_path, tabular_dir, "killed", checkpoint)
    assert failed["status"] == "failed"
    # The whole model and the whole optimizer state, not rank 0's shard of them (the file is a
    # JSON header line, then torch.save's bytes: training/checkpoint.py).
    payload = checkpoint.read_bytes().split(b"\n", 1)[1]
    saved = torch.load(io.BytesIO(payload), weights_only=False)
    assert tuple(saved["model"]["net.3.weight"].shape) == (32, 32)
    moments = [v for s in saved["optimizer"]["state"].values() for k, v in s.items()
               if k == "exp_avg"]  # fmt: skip
    whole = sorted(tuple(w.shape) for w in saved["model"].values())
    assert sorted(tuple(m.shape) for m in moments) == whole
    monkeypatch.delenv("DMLS_FAULT")
    resumed = job(spec, tmp_path, tabular_dir, "killed", checkpoint)
    assert resumed["status"] == "ok" and resumed["seeds"][0]["resumed_from_epoch"] == 1
    assert epochs(resumed) == pytest.approx(epochs(ddp), rel=1e-5, abs=1e-6)


def test_sharding_needs_torchrun_and_fsdp_refuses_fp8():
    with pytest.raises(SpecError, match=r"\.sharding: 'optimizer' shards over torchrun"):
        make_spec(sharding="optimizer", launcher="single")
    with pytest.raises(SpecError, match=r"\.sharding: 'full' \(FSDP2\) with precision 'fp8'"):
        make_spec(sharding="full", launcher="torchrun", nproc_per_node=2, precision="fp8",
                  device="cuda", backend="nccl")  # fmt: skip


def test_predicted_peaks_follow_each_strategys_timeline():
    """Layers of 40, 400, 400, 400 and 8 bytes of weights (P = 312 parameters), N = 4, 100
    bytes of layer outputs. DDP and ZeRO-1: state + 4·P of buckets. ZeRO-2: weights and Adam
    state (3/4 of 16·P/N = 936) + every gathered weight (1,248) + two of the largest gradients.
    ZeRO-3: 936 + max over layers k of the reduced shards after k, 2·W(k), W(k−1) and W(k+1):
    at k = 1 (the second layer), 808/4 + 800 + 40 + 400 = 1,442; k = 2: 102 + 800 + 800 = 1,702;
    k = 3: 2 + 800 + 400 + 8 = 1,210."""
    from dmls.special.sharding.measure import predicted_peak

    layers, p, n = [40, 400, 400, 400, 8], 312, 4
    state = 16 * p // n  # 1,248
    assert predicted_peak("none", 16 * p, p, layers, n, 100) == 16 * p + 4 * p + 100
    assert predicted_peak("optimizer", 3000, p, layers, n, 100) == 3000 + 4 * p + 100
    assert predicted_peak("gradients", state, p, layers, n, 100) == 936 + 1248 + 800 + 100
    assert predicted_peak("full", state, p, layers, n, 100) == 936 + 1702 + 100


def test_a_study_stopped_part_way_measures_only_the_setups_left(tmp_path, monkeypatch):
    """D4 keeps each measured setup's records until its results are written: stopped during
    the third setup, it measures the third and fourth only when run again, then drops them."""
    from dmls.data import datasets
    from dmls.special.sharding import measure as sharding

    datasets.prepare("synthetic_cifar", {"n_train": 8, "n_test": 4, "seed": 0}, tmp_path)
    cfg = {"dataset": "synthetic_cifar", "devices": ["cpu"], "processes": [2],
           "strategies": ["none", "optimizer", "gradients", "full"], "batch_size": 4,
           "steps": 1, "repeats": 2, "collectives_csv": None,
           "model": {"cpu": {"hidden": 16, "layers": 2}}}  # fmt: skip
    measured, stops = [], []

    def fake_measure(spec, data_dir, out_dir):
        if spec.run in stops:
            stops.remove(spec.run)
            raise KeyboardInterrupt  # the study is stopped here, as by a time limit
        measured.append(spec.run)
        record = {"parameters": 1000, "params_bytes": 4000, "grads_bytes": 4000,
                  "optimizer_bytes": 8000, "activations_bytes": 100,
                  "peak_allocated_bytes": None, "step_s": [0.01, 0.011]}  # fmt: skip
        return [record, record]

    def stopped_at(setup: str, settings: dict) -> None:
        stops.append(setup)
        with pytest.raises(KeyboardInterrupt):
            sharding.run(settings, out, data_dir=tmp_path)

    monkeypatch.setattr(sharding, "measure", fake_measure)
    out = tmp_path / "out"
    out.mkdir()
    stopped_at("gradients_2_cpu", cfg)
    assert measured == ["none_2_cpu", "optimizer_2_cpu"]
    assert sorted(p.name for p in (out / "measured").iterdir()) == [
        "none_2_cpu.json", "optimizer_2_cpu.json"
    ]  # fmt: skip
    result = sharding.run(cfg, out, data_dir=tmp_path)
    assert measured[2:] == ["gradients_2_cpu", "full_2_cpu"]
    assert [r["status"] for r in result["rows"]] == ["ok"] * 4
    assert not (out / "measured").exists()
    # Run again with another setting: what the stopped attempt measured is not reused.
    stopped_at("full_2_cpu", cfg)
    sharding.run(cfg | {"batch_size": 8}, out, data_dir=tmp_path)
    assert len(measured) == 4 + 3 + 4


D4 = {"dataset": "synthetic_cifar", "devices": ["cpu"], "processes": [2],
      "strategies": ["full"], "batch_size": 4, "steps": 2, "repeats": 2,
      "collectives_csv": None, "model": {"cpu": {"hidden": 32, "layers": 2}}}  # fmt: skip


@pytest.fixture(scope="module")
def d4_data(tmp_path_factory):
    from dmls.data import datasets

    data = tmp_path_factory.mktemp("d4")
    datasets.prepare("synthetic_cifar", {"n_train": 16, "n_test": 4, "seed": 0}, data)
    return data


def test_d4_measures_a_zero3_step_through_the_engines_public_interface(tmp_path, d4_data):
    """2 CPU ranks started as a training run's: each keeps half of every tensor, so its
    gradients take its parameters' bytes and Adam's two moments twice that."""
    from dmls.files import read_json
    from dmls.special.sharding import measure as sharding

    spec = sharding.run_spec(D4, "cpu", "full", 2)
    records = sharding.measure(spec, d4_data, tmp_path)
    assert [r["rank"] for r in records] == [0, 1]
    manifest = read_json(d4_data / "synthetic_cifar.json")
    shapes, _ = sharding.layout(spec, manifest["input_shape"], manifest["num_classes"])
    for r in records:
        assert r["grads_bytes"] == r["params_bytes"] > 0
        # Adam's two moments, and its step count: one fp32 scalar per tensor.
        assert r["optimizer_bytes"] == 2 * r["params_bytes"] + 4 * len(shapes)
        assert r["activations_bytes"] > 0 and len(r["step_s"]) == D4["repeats"]
        assert r["peak_allocated_bytes"] is None  # no allocator count on the CPU
    state = max(r["params_bytes"] + r["grads_bytes"] + r["optimizer_bytes"] for r in records)
    assert state == pytest.approx(sharding.expected_state("full", shapes, 2), rel=1e-3)
    assert list(tmp_path.iterdir()) == []  # nothing left behind but what it returned


def test_a_d4_rank_that_fails_ends_its_setup_at_once_and_the_reason_names_it(
    tmp_path, d4_data, monkeypatch
):
    """Rank 1 raises in the warm-up epoch (a fault drill, training/faults.py): its peer is
    stopped long before the ranks' timeout, and the reason is rank 1's error, not the lost
    connection its peer may report."""
    from dmls.special import ranks
    from dmls.special.sharding import measure as sharding

    spec = sharding.run_spec(D4, "cpu", "full", 2)
    monkeypatch.setenv("DMLS_FAULT", f"rank=1,epoch=1,kind=raise,run={spec.run_id}")
    start = time.monotonic()
    with pytest.raises(sharding.SetupFailed) as failed:
        sharding.measure(spec, d4_data, tmp_path)
    assert time.monotonic() - start < ranks.TIMEOUT_S / 10
    assert str(failed.value).startswith(
        "rank 1 raised InjectedFault: injected fault (DMLS_FAULT): rank 1, epoch 1, kind raise"
    )
    assert (tmp_path / "ranks" / spec.run / "error-rank1.json").exists()
