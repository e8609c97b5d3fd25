"""The parallel strategies (dmls/training/parallel.py), each on its own; tests/test_engine.py
trains through the real launchers."""

import pytest
import torch
from torch import nn

from conftest import make_spec
from dmls.supervisor.launch import free_port
from dmls.training.parallel import (
    Accelerate,
    DataParallel,
    DistributedDataParallel,
    SingleDevice,
    strategy_for,
)


def test_each_launcher_has_its_strategy():
    kinds = {
        "single": SingleDevice, "dp": DataParallel, "torchrun": DistributedDataParallel,
        "accelerate": Accelerate,
    }  # fmt: skip
    for launcher, cls in kinds.items():
        n = 1 if launcher == "single" else 2
        assert type(strategy_for(make_spec(launcher=launcher, nproc_per_node=n))) is cls


def test_dataparallel_takes_a_batch_per_gpu_in_its_one_process():
    dp = strategy_for(make_spec(launcher="dp", nproc_per_node=2, batch_size=32))
    ddp = strategy_for(make_spec(launcher="torchrun", nproc_per_node=2, batch_size=32))
    assert dp.samples_per_step == 64 and ddp.samples_per_step == 32
    assert not dp.cudnn_autotune and ddp.cudnn_autotune
    assert ddp.graph_warmup_steps > SingleDevice.graph_warmup_steps


def test_the_engine_applies_precision_unless_accelerate_does():
    for precision, dtype in [("fp32", None), ("fp16", torch.float16), ("bf16", torch.bfloat16)]:
        assert strategy_for(make_spec(precision=precision)).autocast_dtype == dtype
        acc = strategy_for(make_spec(launcher="accelerate", precision=precision))
        assert acc.autocast_dtype is None and not acc.converts_to_float8
    assert strategy_for(make_spec(precision="fp8", batch_size=32)).converts_to_float8


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_single_device_steps_with_its_loss_scaler_only_in_fp16(precision):
    strategy = strategy_for(make_spec(device="cpu", precision=precision))
    process = strategy.join()
    assert (process.rank, process.world_size, process.device) == (0, 1, torch.device("cpu"))
    assert strategy.gpu_indices() == []
    model = nn.Linear(2, 1)
    before = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    module, _, _ = strategy.prepare(model, optimizer, None)
    assert module is model  # nothing to wrap
    strategy.backward(model(torch.ones(1, 2)).sum())
    strategy.optimizer_step(optimizer)
    torch.testing.assert_close(model.weight.detach(), before - 0.5)
    assert (strategy.loss_scaler is not None) == (precision == "fp16")


def test_ddp_joins_the_group_torchrun_prepared_and_skips_sync_on_request(monkeypatch):
    spec = make_spec(device="cpu", launcher="torchrun", nproc_per_node=1, backend="gloo")
    strategy = strategy_for(spec)
    with pytest.raises(RuntimeError, match=r"RANK is unset: start train\.py via torchrun"):
        strategy.join()
    env = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), GROUP_RANK="0")  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    process = strategy.join()
    try:
        assert process.world_size == 1 and torch.distributed.is_initialized()
        model = nn.Linear(2, 1)
        module, _, _ = strategy.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), None)
        assert isinstance(module, nn.parallel.DistributedDataParallel)
        with strategy.no_sync(skip=True):
            assert not module.require_backward_grad_sync
        with strategy.no_sync(skip=False):
            assert module.require_backward_grad_sync
    finally:
        strategy.close()  # (a world of one has no peer to wait for: it leaves the group be)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _fake_broadcast(tensors, devices, detach=False):
    """replicate's broadcast without GPUs: a copy per device, through autograd unless detached
    (as Broadcast.apply does on CUDA)."""
    return [[t.detach().clone() if detach else t * 1 for t in tensors] for _ in devices]


def test_persistent_replicas_lay_out_what_replicate_does_and_are_kept_between_steps(
    monkeypatch,
):
    """The course CNN on two fake devices (the broadcast stubbed, CPU): the first call builds
    the replicas with torch's replicate, later calls keep their module objects and only set
    the new copies; the outputs and the gradients that reach the originals equal replicate's;
    a train/eval or grad-mode change builds them again."""
    from dmls.training.models import CourseCNN
    from dmls.training.parallel import PersistentReplicas, replicate_module

    monkeypatch.setattr(replicate_module, "_broadcast_coalesced_reshape", _fake_broadcast)
    torch.manual_seed(0)
    network = CourseCNN((3, 32, 32), 10, [8, 16], 32, 0.0, True, "relu")
    x = torch.randn(4, 3, 32, 32)
    replicas = PersistentReplicas()

    def grads(build):
        network.zero_grad()
        outputs = [r(x) for r in build()]
        sum(o.square().sum() for o in outputs).backward()
        return [p.grad.clone() for p in network.parameters()], outputs

    stock_grads, stock_out = grads(lambda: replicate_module.replicate(network, [0, 1]))
    first = replicas(network, [0, 1], detach=False)
    kept_grads, kept_out = grads(lambda: replicas(network, [0, 1], detach=False))
    second = replicas(network, [0, 1], detach=False)
    assert replicas.builds == 1
    assert [id(r) for r in second] == [id(r) for r in first]  # the same module objects
    for ours, theirs in zip(kept_out, stock_out, strict=True):
        torch.testing.assert_close(ours, theirs)
    for ours, theirs in zip(kept_grads, stock_grads, strict=True):
        torch.testing.assert_close(ours, theirs)
    # Each step sets fresh copies, as replicate does: no longer leaves, not the originals.
    conv = next(m for m in second[0].modules() if isinstance(m, nn.Conv2d))
    original = next(m for m in network.modules() if isinstance(m, nn.Conv2d))
    assert conv.weight is not original.weight and not conv.weight.is_leaf
    assert conv._former_parameters["weight"] is conv.weight
    torch.testing.assert_close(conv.weight, original.weight)
    # An optimizer step changes the originals in place: the next step's copies follow.
    with torch.no_grad():
        original.weight.add_(1.0)
    third = replicas(network, [0, 1], detach=False)
    conv = next(m for m in third[1].modules() if isinstance(m, nn.Conv2d))
    torch.testing.assert_close(conv.weight, original.weight)
    assert replicas.builds == 1
    network.eval()
    assert not replicas(network, [0, 1], detach=False)[0].training
    assert replicas.builds == 2
    with torch.no_grad():
        evaluated = replicas(network, [0, 1], detach=True)
    assert replicas.builds == 3 and not evaluated[0].training
