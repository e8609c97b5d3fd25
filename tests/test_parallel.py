"""The parallel strategies (dmls/training/parallel.py), each on its own; tests/test_engine.py
trains through the real launchers."""

import copy
import importlib

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


def test_persistent_replicas_learn_what_replicate_learns_and_are_kept_between_steps(
    monkeypatch,
):
    """The course CNN (with BatchNorm) on two "devices" that are both the CPU: replicate's
    replicas (its broadcast stubbed) and PersistentReplicas give the same outputs and the same
    gradients on the network, the second device's summed in at the end of the backward; the
    copies' weights and gradients are views into one flat tensor per dtype, laid out as the
    network's (channels_last too); the copies are kept between steps and follow the network's
    weights and train/eval mode; a new parameter builds them again."""
    replicate_module = importlib.import_module("torch.nn.parallel.replicate")
    from dmls.training.models import CourseCNN
    from dmls.training.parallel import PersistentReplicas

    monkeypatch.setattr(replicate_module, "_broadcast_coalesced_reshape", _fake_broadcast)
    torch.manual_seed(0)
    network = CourseCNN((3, 32, 32), 10, [8, 16], 32, 0.0, True, "relu")
    network = network.to(memory_format=torch.channels_last)
    initial, reference = copy.deepcopy(network), copy.deepcopy(network)
    halves = torch.randn(4, 3, 32, 32), torch.randn(4, 3, 32, 32)
    cpu = [torch.device("cpu")] * 2
    replicas = PersistentReplicas()

    def step(net, build, gathered=lambda out: out):
        out = gathered(torch.cat([r(x) for r, x in zip(build(), halves, strict=True)]))
        out.square().sum().backward()
        return out, [p.grad.clone() for p in net.parameters()]

    stock_out, stock_grads = step(reference, lambda: replicate_module.replicate(reference, [0, 1]))
    seen = []  # a forward hook on the network sees every replica's forward, as replicate's do
    hook = network.register_forward_hook(lambda module, args, out: seen.append(out.shape[0]))
    ours_out, ours_grads = step(
        network, lambda: replicas(network, cpu), replicas.sum_gradients_in_backward
    )
    hook.remove()
    assert seen == [4, 4]
    torch.testing.assert_close(ours_out, stock_out)
    for ours, theirs in zip(ours_grads, stock_grads, strict=True):
        torch.testing.assert_close(ours, theirs)
    first, copy_ = replicas(network, cpu)
    assert first is network and replicas.builds == 1
    assert all(not p.grad.any() for p in copy_.parameters())  # summed, then zeroed
    conv = next(m for m in copy_.modules() if isinstance(m, nn.Conv2d))
    channels_last = next(network.parameters()).stride()
    assert conv.weight.stride() == channels_last != conv.weight.contiguous().stride()
    assert len({p.untyped_storage().data_ptr() for p in copy_.parameters()}) == 1
    # Each view starts 256 bytes on from another, as allocations of their own would (CUDA
    # kernels need it; the CUDA allocator's blocks start on 512 bytes).
    starts = [t.data_ptr() - t.untyped_storage().data_ptr() for t in copy_.parameters()]
    assert all(start % 256 == 0 for start in starts) and len(set(starts)) == len(starts)
    assert len({p.grad.untyped_storage().data_ptr() for p in copy_.parameters()}) == 1
    assert all(p.is_leaf and p.requires_grad for p in copy_.parameters())
    # The network's BatchNorm saw its own half only, as with replicate (the copies' updates
    # are dropped).
    alone = copy.deepcopy(initial)
    alone(halves[0])
    for (name, ours), theirs in zip(network.named_buffers(), alone.buffers(), strict=True):
        torch.testing.assert_close(ours, theirs, msg=name)

    # A second backward without zeroing accumulates, as it does through replicate.
    step(network, lambda: replicas(network, cpu), replicas.sum_gradients_in_backward)
    for p, once in zip(network.parameters(), ours_grads, strict=True):
        torch.testing.assert_close(p.grad, 2 * once)
    # An optimizer step changes the network in place: the next step's copy follows, and the
    # copy is the same object.
    with torch.no_grad():
        for p in network.parameters():
            p.add_(0.5)
    again = replicas(network, cpu)
    assert again[1] is copy_ and replicas.builds == 1
    for ours, theirs in zip(
        copy_.state_dict().values(), network.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(ours, theirs)
    network.eval()
    with torch.no_grad():
        evaluated = replicas(network, cpu)
        assert not any(m.training for m in evaluated[1].modules()) and replicas.builds == 1
        torch.testing.assert_close(evaluated[1](halves[1]), network(halves[1]))
    # A parameter the network itself gave no gradient keeps none; the copy's is zeroed all
    # the same, not carried into the next step.
    network.train()
    network.zero_grad()
    copies = replicas(network, cpu)
    replicas.sum_gradients_in_backward(copies[1](halves[1])).sum().backward()
    assert all(p.grad is None for p in network.parameters())
    assert all(not p.grad.any() for p in copies[1].parameters())
    # A parameter that is a new tensor builds the copies again.
    conv = next(m for m in network.modules() if isinstance(m, nn.Conv2d))
    conv.weight = nn.Parameter(conv.weight.detach().clone())
    assert replicas(network, cpu)[1] is not copy_ and replicas.builds == 2
