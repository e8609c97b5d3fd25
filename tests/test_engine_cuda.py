"""The fast step on a GPU: a CUDA-graph run learns what the eager run learns (GPU hosts only;
bench/gpu_speed.sh runs it)."""

import pytest
import torch

from conftest import make_spec
from dmls import record
from dmls.data import datasets
from dmls.training import job as trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CNN = {"name": "cnn", "conv_channels": [16, 32], "fc_hidden": 64, "batch_norm": True}


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("images")
    datasets.prepare("synthetic_cifar", {"n_train": 2000, "n_test": 500, "seed": 0}, out)
    return out


def train(tmp_path, data_dir, name, **overrides):
    settings = dict(
        dataset="synthetic_cifar", model=CNN, device="cuda", epochs=3, batch_size=64,
        optimizer={"name": "adamw", "lr": 0.003, "weight_decay": 0.05},
        scheduler={"name": "onecycle", "max_lr": 0.003},
    )  # fmt: skip
    spec = make_spec(run=name, **(settings | overrides))
    run_dir = tmp_path / name
    run_dir.mkdir()
    # The job's result with its seeds combined, as the supervisor records it.
    result = record.combine(trainer.train(spec, data_dir, run_dir, run_dir / "ckpt.pt"))
    assert result is not None and result["status"] == "ok", result
    for s in result["seeds"]:  # (what a step adds + what was held) <= the allocated peak
        assert record.step_memory_problem(s) is None
        assert s["step_gpu_mem_bytes"] > 0 and s["graph_pool_reserved_bytes"] is not None
    if spec.seeds > 1:
        return result
    return result["seeds"][0] | {k: result[k] for k in ("status", "ranks", "world_size")}


def assert_learns_the_same(eager, fast):
    """The same loss curve within 5% and the same test accuracy within 0.05: channels_last,
    fused optimizers, autotuned convolutions and graphs change rounding, not what is learned."""
    for e, f in zip(eager["history"], fast["history"], strict=True):
        assert f["train_loss"] == pytest.approx(e["train_loss"], rel=0.05)
    assert fast["final"]["test_accuracy"] == pytest.approx(
        eager["final"]["test_accuracy"], abs=0.05
    )


@pytest.mark.parametrize("step", ["graph", "compile"])
def test_a_captured_step_learns_what_the_eager_step_learns(tmp_path, images_dir, step):
    eager = train(tmp_path, images_dir, "eager", step="eager")
    fast = train(tmp_path, images_dir, step, step=step)
    record = fast["step"]
    assert record["mode"] == "cuda_graph" and record["memory_format"] == "channels_last"
    assert record["compiled"] is (step == "compile")
    # 2000 images / 64 = 31 full batches and a ragged one per epoch: 3 warm-up steps, then
    # every full batch replays the graph and every ragged batch runs eagerly.
    assert record["eager_steps"] == 3 + 3 and record["replayed_steps"] == 3 * 31 - 3
    assert eager["step"]["mode"] == "eager" and eager["step"]["eager_reason"] == "step: eager"
    # A replayed step's activations live in its graph's pool, named apart from what it adds.
    assert fast["graph_pool_reserved_bytes"] > 0 and eager["graph_pool_reserved_bytes"] == 0
    assert_learns_the_same(eager, fast)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_steps_are_captured_too(tmp_path, images_dir, precision):
    eager = train(tmp_path, images_dir, "eager", step="eager")
    fast = train(tmp_path, images_dir, precision, step="graph", precision=precision)
    assert fast["step"]["mode"] == "cuda_graph" and fast["effective_precision"] == precision
    assert fast["final"]["test_accuracy"] == pytest.approx(
        eager["final"]["test_accuracy"], abs=0.05
    )


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_dataparallel_reads_the_device_resident_data_and_says_why_it_is_eager(tmp_path, images_dir):
    dp = train(tmp_path, images_dir, "dp", launcher="dp", nproc_per_node=2)
    assert dp["step"]["mode"] == "eager"
    assert dp["step"]["eager_reason"].startswith("DataParallel copies the model")
    assert [g["index"] for g in dp["ranks"][0]["gpus"]] == [0, 1]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_dataparallel_on_persistent_threads_learns_what_stock_dataparallel_learns(
    tmp_path, images_dir
):
    stock = train(tmp_path, images_dir, "stock", launcher="dp", nproc_per_node=2)
    persistent = train(
        tmp_path, images_dir, "persistent", launcher="dp", nproc_per_node=2,
        replica_threads="persistent",
    )  # fmt: skip
    assert_learns_the_same(stock, persistent)
    assert [g["index"] for g in persistent["ranks"][0]["gpus"]] == [0, 1]
    print(
        "steady epoch (s): stock", stock["timing"]["steady_epoch_s"],
        "persistent", persistent["timing"]["steady_epoch_s"],
    )  # fmt: skip


def train_ddp(tmp_path, data_dir, name, **overrides):
    """Two ranks under torchrun, started as the DAG starts them (dmls.supervisor.supervise)."""
    from dmls.supervisor import supervise

    settings = dict(
        dataset="synthetic_cifar", model=CNN, device="cuda", epochs=3, batch_size=32,
        launcher="torchrun", nproc_per_node=2, backend="nccl",
        optimizer={"name": "adamw", "lr": 0.003, "weight_decay": 0.05},
        scheduler={"name": "onecycle", "max_lr": 0.003},
    )  # fmt: skip
    spec = make_spec(run=name, **(settings | overrides))
    run_dir = tmp_path / name
    with open(tmp_path / f"{name}.log", "w") as log:
        result = supervise.run(
            spec, run_dir=run_dir, data_dir=data_dir, checkpoint_path=tmp_path / f"{name}.pt",
            log=log, threads=4, strict=False, isolation="none",
        )  # fmt: skip
    assert result["status"] == "ok", (tmp_path / f"{name}.log").read_text()[-3000:]
    return result


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("step", ["graph", "compile"])
def test_ddp_with_a_captured_step_learns_what_eager_ddp_learns(tmp_path, images_dir, step):
    eager = train_ddp(tmp_path, images_dir, "eager", step="eager")
    fast = train_ddp(tmp_path, images_dir, step, step=step)
    record = fast["step"]
    assert record["mode"] == "cuda_graph" and record["compiled"] is (step == "compile")
    # 1000 images per rank / 32 = 31 full batches and a ragged one per epoch; DDP warms up
    # for 11 steps before the capture.
    assert record["eager_steps"] == 11 + 3 and record["replayed_steps"] == 3 * 31 - 11
    assert_learns_the_same(eager, fast)


def test_gradient_accumulation_is_captured_as_a_no_sync_and_a_sync_graph(tmp_path, images_dir):
    eager = train(tmp_path, images_dir, "eager", step="eager", grad_accum_steps=2)
    fast = train(tmp_path, images_dir, "graph", step="graph", grad_accum_steps=2)
    record = fast["step"]
    assert record["mode"] == "cuda_graph" and record["graphs"] == 2
    # 32 micro-batches an epoch (the last ragged, eager), 16 optimizer steps: 3 of them (6
    # micro-steps) warm up, then the no-sync and the sync micro-step are each captured.
    assert record["eager_steps"] == 2 * 3 + 3 and record["replayed_steps"] == 3 * 32 - 9
    assert_learns_the_same(eager, fast)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_ddp_gradient_accumulation_replays_graphs_and_learns_what_eager_ddp_learns(
    tmp_path, images_dir
):
    eager = train_ddp(tmp_path, images_dir, "eager", step="eager", grad_accum_steps=4)
    fast = train_ddp(tmp_path, images_dir, "graph", step="graph", grad_accum_steps=4)
    record = fast["step"]
    assert record["mode"] == "cuda_graph" and record["graphs"] == 2
    # 32 micro-batches per rank an epoch (8 groups of 4, the last batch ragged): 11 optimizer
    # steps (44 micro-steps, into epoch 2) warm up DDP before the captures; then the ragged
    # batches of epochs 2 and 3 run eagerly.
    assert record["eager_steps"] == 4 * 11 + 2 and record["replayed_steps"] == 3 * 32 - 46
    assert_learns_the_same(eager, fast)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="fp8 needs compute capability >= 8.9",
)
@pytest.mark.parametrize("step", ["graph", "compile"])
def test_fp8_trains_out_of_the_box_with_the_pinned_torchao(tmp_path, images_dir, step):
    """torchao is in envs/requirements.txt: an fp8 run converts the eligible Linear layers
    and learns what an fp32 run learns, replayed from a CUDA graph of the eager or the compiled
    step (torchao's dynamic scaling is tensor ops on the device: nothing syncs with the host)."""
    fp32 = train(tmp_path, images_dir, "fp32", step="eager")
    fp8 = train(tmp_path, images_dir, "fp8", precision="fp8", step=step)
    # Float8Linear for the one eligible Linear layer, bf16 autocast for the rest.
    assert fp8["fp8_linear_layers"] == 1 and fp8["effective_precision"] == "bf16+fp8"
    assert fp8["step"]["mode"] == "cuda_graph" and fp8["step"]["compiled"] is (step == "compile")
    # 2000 images at batch 64: fp8 drops the ragged last batch of 16 images.
    assert fp8["data"]["train_samples_unseen_per_epoch"] == 16
    assert fp8["final"]["test_accuracy"] == pytest.approx(fp32["final"]["test_accuracy"], abs=0.05)


@pytest.mark.parametrize("step", ["graph", "compile"])
def test_each_seed_of_a_job_captures_its_own_graph_and_learns(tmp_path, images_dir, step):
    """A later seed trains in a warm process (cuDNN plans, compiled kernels): it captures its
    own graphs for its own model and learns as the first seed does."""
    job = train(tmp_path, images_dir, "seeds", step=step, seeds=2)
    first, second = job["seeds"]
    for seed in (first, second):
        assert seed["step"]["mode"] == "cuda_graph" and seed["step"]["replayed_steps"] > 0
        assert seed["peak_gpu_mem_allocated_bytes"] > 0
    assert first["history"][0]["train_loss"] != second["history"][0]["train_loss"]
    assert second["final"]["test_accuracy"] == pytest.approx(
        first["final"]["test_accuracy"], abs=0.1
    )


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("sharding", ["optimizer", "full"])
def test_sharded_runs_on_nccl_learn_what_ddp_learns_and_say_why_they_step_eagerly(
    tmp_path, images_dir, sharding
):
    ddp = train_ddp(tmp_path, images_dir, "ddp", step="eager")
    sharded = train_ddp(tmp_path, images_dir, sharding, sharding=sharding)  # step: graph asked
    record = sharded["step"]
    assert record["mode"] == "eager"
    assert ("ZeroRedundancyOptimizer" if sharding == "optimizer" else "FSDP2") in record[
        "eager_reason"
    ]
    assert_learns_the_same(ddp, sharded)
