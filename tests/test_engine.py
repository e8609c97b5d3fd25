"""The training engine through the real launchers (gloo on CPU), checked by its numbers."""

import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, make_spec
from dmls import record
from dmls.supervisor import launch, supervise

B_MODEL = {"name": "mlp", "hidden": 16, "batch_norm": False}  # no BN: DDP ≡ one big batch


def run(tmp_path, data_dir, name, strict=True, threads=2, isolation="host", **overrides):
    settings = dict(
        dataset="tabular", model=B_MODEL, device="cpu", backend="gloo", epochs=2, num_workers=0,
        optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9},
    )  # fmt: skip
    spec = make_spec(run=name, **(settings | overrides))
    run_dir = tmp_path / name
    run_dir.mkdir()
    with open(run_dir / "train.log", "w") as log:
        metrics = supervise.run(
            spec,
            run_dir=run_dir,
            data_dir=data_dir,
            checkpoint_path=tmp_path / "checkpoints" / f"{name}.pt",
            log=log,
            threads=threads,
            strict=strict,
            isolation=isolation,
        )
    return metrics, run_dir


def weights(run_dir):
    return torch.load(run_dir / "model.pt", weights_only=True)["model"]


def assert_same_weights(a, b, atol=1e-5):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=0, msg=key)


def test_ddp_two_ranks_equal_one_process_with_the_global_batch(tmp_path, tabular_dir):
    split = {"validation_samples": 64}
    one, one_dir = run(tmp_path, tabular_dir, "single", launcher="single", batch_size=64, **split)
    ddp, ddp_dir = run(
        tmp_path, tabular_dir, "ddp", launcher="torchrun", nproc_per_node=2, batch_size=32,
        **split,
    )  # fmt: skip
    assert one["status"] == ddp["status"] == "ok"
    assert ddp["world_size"] == 2 and sorted(r["rank"] for r in ddp["ranks"]) == [0, 1]
    assert_same_weights(weights(one_dir), weights(ddp_dir))
    # Test and validation metrics cover the whole set (reduced over both shards), so they
    # agree too.
    assert (ddp["data"]["n_train"], ddp["data"]["n_validation"], ddp["data"]["n_test"]) == (
        192, 64, 100
    )  # fmt: skip
    assert ddp["final"]["test_loss"] == pytest.approx(one["final"]["test_loss"], abs=1e-5)
    assert ddp["final"]["test_accuracy"] == pytest.approx(one["final"]["test_accuracy"], abs=1e-9)
    for key in ("val_loss", "val_accuracy"):
        got = [h[key] for h in ddp["history"]]
        assert got == pytest.approx([h[key] for h in one["history"]], abs=1e-5), key
        assert None not in got
    header = (ddp_dir / "history.csv").read_text().splitlines()[0]
    assert header.startswith("seed,epoch,train_loss,train_accuracy,val_loss,val_accuracy,")
    assert len(ddp["history"]) == 2 and ddp["summary"]["samples_per_s"]["mean"] > 0
    (seed,) = ddp["seeds"]
    epochs = [h["train_time_s"] for h in seed["history"]]
    assert (seed["timing"]["first_epoch_s"], seed["timing"]["steady_epoch_s"]) == tuple(epochs)


def test_a_run_trains_inside_the_cores_and_gpus_it_reserved(tmp_path, tabular_dir):
    metrics, _ = run(
        tmp_path, tabular_dir, "pinned", launcher="torchrun", nproc_per_node=2, epochs=1,
        threads=1, omp_wait_policy="passive",
    )  # fmt: skip
    reserved = metrics["reserved"]
    assert len(reserved["cores"]) == 1 and reserved["gpus"] == []
    for rank in metrics["ranks"]:  # both ranks, started by torchrun under the supervisor
        assert rank["cpu_affinity"] == reserved["cores"]
        assert rank["cuda_visible_devices"] == ""
        # B1's n1xp2_passive: the OpenMP wait policy reached each rank, which counts how often
        # it was preempted (two ranks on one core: at least once).
        assert rank["omp_wait_policy"] == "PASSIVE"
        assert rank["involuntary_context_switches"] > 0
    # Where its seconds went: the parts rank 0 timed add up, and fit inside the launcher's.
    t = metrics["timing"]
    assert min(t["import_s"], t["setup_s"], t["checkpoint_time_s"], t["teardown_s"]) > 0
    assert t["train_time_s"] + t["eval_time_s"] + t["checkpoint_time_s"] <= t["fit_s"]
    assert t["setup_s"] + t["fit_s"] + t["teardown_s"] == pytest.approx(t["wall_time_s"], abs=0.05)
    assert t["import_s"] + t["wall_time_s"] < metrics["launch"]["seconds"]
    shared, _ = run(tmp_path, tabular_dir, "shared", epochs=1, isolation="none")
    assert "reserved" not in shared and shared["ranks"][0]["cuda_visible_devices"] is None


def in_a_fresh_process(code: str) -> list[str]:
    """What `code` prints, run by a new interpreter (the collector's state is per process)."""
    env = os.environ | {"PYTHONPATH": str(ROOT / "workflow" / "scripts")}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.split()  # fmt: skip


def collector_states(mode: str, then: str = "") -> list[str]:
    """In a fresh process under policy `mode`: whether the collector is on while torch is
    imported; then, after `before_training`, whether it is on, how many objects are frozen and
    whether torch._dynamo was imported; then what `then` prints."""
    code = f"""
import gc, sys
from dmls.training.collector import GarbageCollection
policy = GarbageCollection({mode!r})
policy.before_imports()
print(gc.isenabled())
import torch
policy.before_training()
print(gc.isenabled(), gc.get_freeze_count(), "torch._dynamo" in sys.modules)
{then}
"""
    return in_a_fresh_process(code)


def test_the_freeze_policy_turns_the_collector_off_for_imports_then_freezes_what_they_built():
    # Then, with the collector on (a caller kept it on), a second call changes nothing.
    then = "gc.unfreeze(); policy.before_training(); print(gc.get_freeze_count())"
    off, on, frozen, dynamo, again = collector_states("freeze", then)
    assert (off, on, dynamo, again) == ("False", "True", "True", "0") and int(frozen) > 0


def test_the_default_policy_leaves_pythons_collector_as_it_is():
    assert collector_states("default")[:3] == ["True", "True", "0"]


def test_the_worker_takes_the_collector_policy_from_its_command_line():
    from dmls.training.collector import GarbageCollection

    def mode(*argv: str) -> str:
        return GarbageCollection.from_argv(["--spec", "{}", *argv]).mode

    assert mode() == "freeze"
    assert mode("--gc", "default") == mode("--gc=default") == "default"
    with pytest.raises(SystemExit):
        mode("--gc", "sometimes")
    with pytest.raises(ValueError, match="one of freeze, default"):
        GarbageCollection("sometimes")


def test_accumulating_k_micro_batches_equals_one_k_times_larger_batch(tmp_path, tabular_dir):
    _, big = run(tmp_path, tabular_dir, "big", batch_size=64, grad_accum_steps=1)
    acc, small = run(tmp_path, tabular_dir, "accum", batch_size=16, grad_accum_steps=4)
    assert acc["derived"]["global_batch_size"] == 64
    assert_same_weights(weights(big), weights(small))


def test_ddp_with_accumulation_uses_no_sync_and_still_matches(tmp_path, tabular_dir):
    _, big = run(tmp_path, tabular_dir, "big", batch_size=64)
    _, ddp = run(
        tmp_path, tabular_dir, "ddp_acc", launcher="torchrun", nproc_per_node=2,
        batch_size=16, grad_accum_steps=2,
    )  # fmt: skip
    assert_same_weights(weights(big), weights(ddp))


def test_effective_precision_is_measured_not_assumed(tmp_path, tabular_dir):
    bf16, _ = run(tmp_path, tabular_dir, "bf16", precision="bf16", epochs=1)
    assert bf16["effective_precision"] == "bf16"
    # accelerate's fp16 on a CPU is a silent no-op: the probe sees fp32.
    acc, _ = run(
        tmp_path, tabular_dir, "acc_fp16", launcher="accelerate", precision="fp16", epochs=1
    )
    assert acc["status"] == "ok" and acc["effective_precision"] == "fp32"


def test_accelerate_on_cpu_really_gets_two_processes(tmp_path, tabular_dir):
    metrics, _ = run(
        tmp_path, tabular_dir, "acc2", launcher="accelerate", nproc_per_node=2, epochs=1
    )
    assert metrics["world_size"] == 2
    assert sorted(r["rank"] for r in metrics["ranks"]) == [0, 1]
    assert "--multi_gpu" in metrics["launch"]["commands"][0]


def test_world_size_mismatch_fails_loudly(tmp_path, tabular_dir, monkeypatch):
    # `accelerate launch --cpu --num_processes 2` starts ONE process: the engine must notice.
    real = launch.build_commands

    def cpu_flag_instead(*args, **kwargs):
        cmds = real(*args, **kwargs)
        for c in cmds:
            c.argv[c.argv.index("--multi_gpu")] = "--cpu"
        return cmds

    monkeypatch.setattr(launch, "build_commands", cpu_flag_instead)
    metrics, _ = run(
        tmp_path, tabular_dir, "trap", strict=False, launcher="accelerate", nproc_per_node=2,
        epochs=1,
    )  # fmt: skip
    assert metrics["status"] == "failed"
    assert "WorldSizeMismatch" in metrics["reason"]
    assert "asks for 2 process(es)" in metrics["reason"]
    assert "history" not in metrics and "final" not in metrics


def test_missing_gpu_is_skipped_with_the_reason(tmp_path, tabular_dir):
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    metrics, _ = run(tmp_path, tabular_dir, "gpu", strict=False, device="cuda")
    assert metrics["status"] == "skipped"
    assert "needs 1 CUDA GPU(s) on this host, found 0" in metrics["reason"]
    assert "config/cpu.yaml" in metrics["reason"]
    with pytest.raises(supervise.RunFailed, match="skipped: needs 1 CUDA GPU"):
        run(tmp_path, tabular_dir, "gpu_strict", strict=True, device="cuda")


def test_absurd_learning_rate_diverges(tmp_path, tabular_dir):
    metrics, run_dir = run(
        tmp_path, tabular_dir, "nan", optimizer={"name": "sgd", "lr": 1e12}, epochs=3
    )
    assert metrics["status"] == "diverged"
    assert "non-finite loss at epoch 1" in metrics["reason"]
    # The diverged seed's own numbers; no mean holds it (record.finished).
    (seed,) = metrics["seeds"]
    assert seed["final"]["epochs_completed"] == 1 and metrics["summary"]["n_finished"] == 0
    assert metrics["final"]["epochs_completed"] is None and metrics["history"] == []
    assert (run_dir / "history.csv").read_text().count("\n") == 2


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory):
    from dmls.data import datasets

    out = tmp_path_factory.mktemp("images")
    datasets.prepare("synthetic_cifar", {"n_train": 96, "n_test": 40, "seed": 0}, out)
    return out


@pytest.mark.parametrize("dataset", ["tabular", "images"])
def test_device_loader_trains_exactly_like_the_course_dataloader(
    tmp_path, tabular_dir, images_dir, dataset
):
    # Without random augmentation both paths feed the same batches in the same order, so the
    # weights agree; with it, they draw different random numbers (see test_device_resident.py).
    settings = {"launcher": "torchrun", "nproc_per_node": 2, "batch_size": 16}
    if dataset == "images":
        cnn = {"name": "cnn", "conv_channels": [4], "fc_hidden": 8, "batch_norm": True}
        settings |= {"dataset": "synthetic_cifar", "model": cnn}
    data_dir = tabular_dir if dataset == "tabular" else images_dir
    course, course_dir = run(tmp_path, data_dir, "course", loader="torch", **settings)
    fast, fast_dir = run(tmp_path, data_dir, "fast", loader="device", **settings)
    assert course["status"] == fast["status"] == "ok"
    assert_same_weights(weights(course_dir), weights(fast_dir), atol=1e-6)
    assert fast["final"]["test_loss"] == pytest.approx(course["final"]["test_loss"], abs=1e-6)
    assert fast["step"] == {
        "requested": "graph",
        "compiled": False,
        "memory_format": "contiguous",
        "wrapper": "DistributedDataParallel",
        "mode": "eager",
        "eager_reason": "CUDA graphs need a GPU; this run trains on the CPU",
    }


def test_more_micro_batches_per_step_than_an_epoch_has_is_refused_naming_the_key(tabular_dir):
    """Before: grad_accum_steps 100 over 16 micro-batches ended ok, recording a global batch
    that no optimizer step saw."""
    from dmls.config.spec import SpecError
    from dmls.training import job as trainer

    spec = make_spec(
        dataset="tabular", model={"name": "mlp", "hidden": 8}, device="cpu", epochs=1,
        batch_size=64, grad_accum_steps=5, num_workers=0,
    )  # fmt: skip
    with pytest.raises(SpecError) as err:
        trainer.train(spec, tabular_dir, tabular_dir, tabular_dir / "unused-c.pt")
    assert str(err.value) == (
        "studies.t.runs.r.grad_accum_steps: 5 micro-batches per optimizer step, but an epoch "
        "has 4 per rank (256 samples, 64 per micro-batch); use at most 4 "
        "(found in the job: this data's size is known only once it is read)"
    )


def test_a_batch_larger_than_the_training_set_is_refused_naming_the_key(tabular_dir):
    """batch_size 100000 on 512 samples ended `ok`, recording a global batch of 100000 where
    the one batch each epoch had was 512. Where the config fixes the data's size this is
    refused before any job (tests/test_config_checks.py); here the spec's config says 8,000
    samples (the synthetic default) and the data read has 256, as a folder of one's own
    would."""
    from dmls.config.spec import SpecError
    from dmls.training import job as trainer

    spec = make_spec(dataset="tabular", model={"name": "mlp", "hidden": 8}, device="cpu",
                     epochs=1, batch_size=300, num_workers=0)  # fmt: skip
    with pytest.raises(SpecError) as err:
        trainer.train(spec, tabular_dir, tabular_dir, tabular_dir / "unused-c.pt")
    assert str(err.value) == (
        "studies.t.runs.r.batch_size: 300 per replica × 1 replica(s) = 300 samples per "
        "step, but the training set has 256; use at most 256 "
        "(found in the job: this data's size is known only once it is read)"
    )


def test_a_last_batch_of_one_sample_under_batch_norm_is_left_out_and_recorded(tmp_path):
    """Before: 513 rows at batch 32 made BatchNorm1d raise after epoch 1, naming no setting."""
    from dmls.data import datasets
    from dmls.training import job as trainer

    cfg = {"dir": None, "synthetic": {"n_train": 513, "n_test": 64, "seed": 0}}
    datasets.prepare("tabular", cfg, tmp_path)
    common = dict(dataset="tabular", device="cpu", epochs=2, batch_size=32, num_workers=0)

    def train(name: str, batch_norm: bool, loader: str) -> dict:
        model = {"name": "mlp", "hidden": 8, "batch_norm": batch_norm}
        spec = make_spec(model=model, loader=loader, **common)
        # The job's result with its seeds combined, as the supervisor records it.
        return record.combine(trainer.train(spec, tmp_path, tmp_path, tmp_path / f"{name}.pt"))

    for loader in ("torch", "device"):
        result = train(loader, True, loader)
        assert result["status"] == "ok" and len(result["seeds"][0]["history"]) == 2
        assert result["data"]["train_samples_unseen_per_epoch"] == 1
        assert result["data"]["train_samples_unseen_reason"] == (
            "the last batch would put 1 sample(s) on a device, and batch norm over feature "
            "vectors needs at least 2 in training"
        )
    # Without batch norm nothing is left out.
    plain = train("plain", False, "device")
    assert plain["data"]["train_samples_unseen_per_epoch"] == 0
    assert plain["data"]["train_samples_unseen_reason"] is None


def test_a_validation_split_that_leaves_less_than_a_batch_is_refused_naming_the_key(tabular_dir):
    from dmls.config.spec import SpecError
    from dmls.training import job as trainer

    spec = make_spec(dataset="tabular", model={"name": "mlp", "hidden": 8}, device="cpu",
                     epochs=1, batch_size=32, validation_samples=240, num_workers=0)  # fmt: skip
    with pytest.raises(SpecError) as err:
        trainer.train(spec, tabular_dir, tabular_dir, tabular_dir / "unused-c.pt")
    assert str(err.value) == (
        "studies.t.runs.r.validation_samples: 240 of the 256 training samples held out leave "
        "16 to train, fewer than one step's batch of 32; use at most 224 "
        "(found in the job: this data's size is known only once it is read)"
    )


@pytest.mark.parametrize("loader", ["device", "torch"])
def test_the_validation_split_is_the_last_training_rows_and_never_trains(tabular_dir, loader):
    from dmls.data import datasets
    from dmls.data.loaders import make_loaders

    ds = datasets.load(tabular_dir, "tabular")
    row_index = {row.tobytes(): i for i, row in enumerate(ds.x_train)}

    def indices(batches) -> list[int]:
        return [row_index[row.numpy().tobytes()] for x, _ in batches for row in x]

    # `train_samples` takes its first N from what the split leaves.
    for train_samples, trained in ((0, range(192)), (128, range(128))):
        spec = make_spec(
            dataset="tabular", device="cpu", batch_size=16, num_workers=0, loader=loader,
            validation_samples=64, train_samples=train_samples,
        )  # fmt: skip
        ranks = [
            make_loaders(spec, tabular_dir, rank=r, world_size=2, device=torch.device("cpu"),
                         samples_per_step=16, memory_format=torch.contiguous_format)
            for r in (0, 1)
        ]  # fmt: skip
        assert [(d.n_train, d.n_validation) for d in ranks] == [(len(trained), 64)] * 2
        # Each rank's shard of rows 192..255, without padding, labels with their rows.
        for r, data in enumerate(ranks):
            assert indices(data.validation) == list(range(192 + r, 256, 2))
            labels = torch.cat([y for _, y in data.validation])
            assert torch.equal(labels, torch.from_numpy(ds.y_train[192 + r :: 2]))
        assert sorted(i for d in ranks for i in indices(d.train)) == list(trained)
    off = make_loaders(make_spec(dataset="tabular", device="cpu", num_workers=0), tabular_dir,
                       rank=0, world_size=1, device=torch.device("cpu"), samples_per_step=32,
                       memory_format=torch.contiguous_format)  # fmt: skip
    assert (off.validation, off.n_validation, off.n_train) == (None, 0, 256)


def train_in_process(data_dir, run_dir, **overrides) -> dict:
    """One seed of a small B-shaped run with a validation split, trained in this process."""
    from dmls.training import job as trainer

    settings = dict(
        dataset="tabular", model=B_MODEL, device="cpu", epochs=8, batch_size=32, num_workers=0,
        optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9}, validation_samples=64,
    )  # fmt: skip
    spec = make_spec(**(settings | overrides))
    run_dir.mkdir()
    return record.combine(trainer.train(spec, data_dir, run_dir, run_dir / "checkpoint.pt"))


def test_early_stopping_never_reads_the_test_set(tmp_path, tabular_dir):
    """Before: early stopping watched the test loss, so the test set chose the epoch."""
    import shutil
    from itertools import pairwise

    import numpy as np

    from dmls.data import datasets

    # The same prepared data, but its test labels drawn at random.
    scrambled = tmp_path / "scrambled"
    scrambled.mkdir()
    (manifest, arrays), (to_manifest, to_arrays) = (
        datasets.prepared_files(d, "tabular") for d in (tabular_dir, scrambled)
    )
    shutil.copy(manifest, to_manifest)
    with np.load(arrays) as z:
        replaced = {k: z[k] for k in z.files}
    y = replaced["y_test"]
    replaced["y_test"] = np.random.default_rng(1).integers(0, y.max() + 1, len(y), dtype=y.dtype)
    np.savez(to_arrays, **replaced)
    assert (replaced["y_test"] != y).mean() > 0.5

    (a,), (b,) = (
        train_in_process(data, tmp_path / name, early_stopping_patience=1)["seeds"]
        for data, name in ((tabular_dir, "real_run"), (scrambled, "scrambled_run"))
    )
    assert a["status"] == b["status"] == "ok"
    stopped = a["final"]["stopped_early_epoch"]
    assert stopped is not None and stopped < 8  # it did stop early
    assert b["final"]["stopped_early_epoch"] == stopped
    for key in ("val_loss", "val_accuracy", "train_loss"):
        assert [h[key] for h in a["history"]] == [h[key] for h in b["history"]], key
    assert [h["test_loss"] for h in a["history"]] != [h["test_loss"] for h in b["history"]]
    # Patience 1: the validation loss fell every epoch until the one it stopped at.
    val = [h["val_loss"] for h in a["history"]]
    assert len(val) == stopped and val[-1] >= min(val[:-1])
    assert all(x > y for x, y in pairwise(val[:-1]))


def test_history_rows_carry_the_validation_metrics_only_with_a_split(tmp_path, tabular_dir):
    on = train_in_process(tabular_dir, tmp_path / "on", epochs=2)
    off = train_in_process(tabular_dir, tmp_path / "off", epochs=2, validation_samples=0)
    (seed_on,), (seed_off,) = on["seeds"], off["seeds"]
    assert [len({"val_loss", "val_accuracy"} & set(row)) for row in seed_on["history"]] == [2, 2]
    assert [len({"val_loss", "val_accuracy"} & set(row)) for row in seed_off["history"]] == [0, 0]
    assert (on["data"]["n_validation"], on["data"]["n_train"]) == (64, 192)
    assert (off["data"]["n_validation"], off["data"]["n_train"]) == (0, 256)
    # The last epoch's numbers are the saved model's on the last 64 training rows.
    loss, accuracy = saved_model_on_validation(tmp_path / "on", tabular_dir)
    last = seed_on["history"][-1]
    assert last["val_loss"] == pytest.approx(loss, rel=1e-6)
    assert last["val_accuracy"] == accuracy


def saved_model_on_validation(run_dir, data_dir) -> tuple[float, float]:
    """The loss and accuracy of the model `run_dir` saved (B_MODEL) on the validation split of
    `train_in_process` (the last 64 training rows)."""
    from dmls.data import datasets
    from dmls.training.models import build_model

    ds = datasets.load(data_dir, "tabular")
    model = build_model(
        make_spec(model=B_MODEL).model, ds.manifest["input_shape"], ds.manifest["num_classes"]
    )
    model.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True)["model"])
    model.eval()
    x, y = torch.from_numpy(ds.x_train[-64:]), torch.from_numpy(ds.y_train[-64:]).long()
    with torch.no_grad():
        logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, y).item()
    return loss, (logits.argmax(1) == y).sum().item() / 64


FINAL = ("train_loss", "train_accuracy", "test_loss", "test_accuracy")


def test_early_stopping_goes_back_to_the_weights_of_the_lowest_validation_loss(
    tmp_path, tabular_dir
):
    """Before: early stopping kept the last epoch's weights, `patience` epochs past the lowest
    validation loss, and the seed's final numbers were that last epoch's."""
    (seed,) = train_in_process(tabular_dir, tmp_path / "stopped", early_stopping_patience=2)[
        "seeds"
    ]
    history, final = seed["history"], seed["final"]
    val = [h["val_loss"] for h in history]
    best = val.index(min(val)) + 1
    assert final["stopped_early_epoch"] == len(history) == best + 2 < 8  # patience 2
    assert final["restored_best_epoch"] == best
    # Its test numbers measured again on the restored weights: that epoch's, exactly
    # (evaluation is deterministic); its training numbers are the ones that epoch trained with.
    for key in FINAL:
        assert final[key] == history[best - 1][key], key
    assert final["test_loss"] != history[-1]["test_loss"]
    assert final["best_test_accuracy"] == max(h["test_accuracy"] for h in history)
    # The weights saved are that epoch's: their validation loss is its.
    loss, accuracy = saved_model_on_validation(tmp_path / "stopped", tabular_dir)
    assert loss == pytest.approx(history[best - 1]["val_loss"], rel=1e-6)
    assert accuracy == history[best - 1]["val_accuracy"]

    # Without early stopping the same run trains every epoch, the same epochs up to the stop,
    # and keeps its last weights and numbers, as before.
    (whole,) = train_in_process(tabular_dir, tmp_path / "whole")["seeds"]
    assert len(whole["history"]) == 8
    assert (whole["final"]["stopped_early_epoch"], whole["final"]["restored_best_epoch"]) == (
        None, None
    )  # fmt: skip
    for got, want in zip(history, whole["history"], strict=False):
        for key in (*FINAL, "val_loss", "val_accuracy", "lr"):
            assert got[key] == want[key], (got["epoch"], key)
    for key in FINAL:
        assert whole["final"][key] == whole["history"][-1][key], key
    loss, _ = saved_model_on_validation(tmp_path / "whole", tabular_dir)
    assert loss == pytest.approx(whole["history"][-1]["val_loss"], rel=1e-6)
    # Patience that never runs out: the last weights, too.
    (patient,) = train_in_process(tabular_dir, tmp_path / "patient", epochs=4,
                                  early_stopping_patience=3)["seeds"]  # fmt: skip
    assert patient["final"]["restored_best_epoch"] is None
    assert [patient["final"][key] for key in FINAL] == [whole["history"][3][key] for key in FINAL]


def test_the_unseen_count_is_of_distinct_samples_not_the_samplers_padding_copies(tmp_path):
    """Issue #55 (7): 513 samples on 2 ranks recorded 2 unseen per epoch, though the sampler
    pads 513 to 514 with a copy of a sample that is seen, and 1 distinct sample is never seen.
    Counted here against the sampler's own order, every epoch, for both ranks."""
    import torch

    from dmls.data import datasets
    from dmls.data.loaders import make_loaders

    datasets.prepare("tabular", {"dir": None, "synthetic": {"n_train": 513, "n_test": 64,
                                                            "seed": 0}}, tmp_path)  # fmt: skip
    spec = make_spec(dataset="tabular", device="cpu", batch_size=32, num_workers=0,
                     model={"name": "mlp", "hidden": 8, "batch_norm": True})  # fmt: skip
    ranks = [
        make_loaders(spec, tmp_path, rank=r, world_size=2, device=torch.device("cpu"),
                     samples_per_step=32, memory_format=torch.contiguous_format,
                     min_samples_per_device=2)
        for r in range(2)
    ]  # fmt: skip
    assert [r.unseen_per_epoch for r in ranks] == [1, 1]
    for epoch in range(3):
        seen = set()
        for r in ranks:
            r.sampler.set_epoch(epoch)
            order = list(r.sampler)
            seen |= set(order[: len(order) - len(order) % 32])  # its last batch dropped
        assert 513 - len(seen) == ranks[0].unseen_per_epoch
