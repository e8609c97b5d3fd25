"""The parallel strategies (dmls/training/parallel.py) and DataParallel's persistent replicas
(dmls/training/threaded_dp.py), each on its own; tests/test_engine.py trains through the real
launchers."""

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
from dmls.training.threaded_dp import PersistentReplicas


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
    with pytest.raises(RuntimeError, match=r"RANK is unset: start rank\.py via torchrun"):
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


# PersistentReplicas, with the course CNN (BatchNorm, channels_last) on two "devices" that are
# both the CPU, each taking half of a batch.
CPUS = [torch.device("cpu")] * 2


@pytest.fixture
def course_cnn():
    """The course CNN (with BatchNorm, channels_last) and the two halves of a batch."""
    from dmls.training.models import CourseCNN

    torch.manual_seed(0)
    network = CourseCNN((3, 32, 32), 10, [8, 16], 32, 0.0, True, "relu")
    network = network.to(memory_format=torch.channels_last)
    halves = torch.randn(4, 3, 32, 32), torch.randn(4, 3, 32, 32)
    return network, halves


def _step(net, build, halves, gathered=lambda out: out):
    """One forward and backward of the replicas `build()` gives over the halves: the output
    and the network's gradients."""
    out = gathered(torch.cat([r(x) for r, x in zip(build(), halves, strict=True)]))
    out.square().sum().backward()
    return out, [p.grad.clone() for p in net.parameters()]


def _persistent_step(network, replicas, halves):
    return _step(
        network, lambda: replicas(network, CPUS), halves, replicas.sum_gradients_in_backward
    )


def _after_one_step(network, halves):
    """PersistentReplicas after one step: the replicas, the second device's copy and the
    network's gradients."""
    replicas = PersistentReplicas()
    _, grads = _persistent_step(network, replicas, halves)
    _, copy_ = replicas(network, CPUS)
    return replicas, copy_, grads


def test_persistent_replicas_give_the_outputs_and_gradients_replicate_gives(
    monkeypatch, course_cnn
):
    """replicate's replicas (its broadcast stubbed) and PersistentReplicas agree, the second
    device's gradients summed into the network's at the end of the backward."""
    replicate_module = importlib.import_module("torch.nn.parallel.replicate")
    monkeypatch.setattr(replicate_module, "_broadcast_coalesced_reshape", _fake_broadcast)
    network, halves = course_cnn
    reference = copy.deepcopy(network)
    stock_out, stock_grads = _step(
        reference, lambda: replicate_module.replicate(reference, [0, 1]), halves
    )
    ours_out, ours_grads = _persistent_step(network, PersistentReplicas(), halves)
    torch.testing.assert_close(ours_out, stock_out)
    for ours, theirs in zip(ours_grads, stock_grads, strict=True):
        torch.testing.assert_close(ours, theirs)


def test_a_forward_hook_on_the_network_sees_every_replicas_forward(course_cnn):
    network, halves = course_cnn
    seen = []  # as replicate's replicas, which share the network's hooks
    network.register_forward_hook(lambda module, args, out: seen.append(out.shape[0]))
    _persistent_step(network, PersistentReplicas(), halves)
    assert seen == [4, 4]


def test_persistent_replicas_are_kept_between_steps(course_cnn):
    network, halves = course_cnn
    replicas, _, _ = _after_one_step(network, halves)
    first, _ = replicas(network, CPUS)
    assert first is network and replicas.builds == 1


def test_the_copys_gradients_are_zeroed_once_summed_into_the_network(course_cnn):
    _, copy_, _ = _after_one_step(*course_cnn)
    assert all(not p.grad.any() for p in copy_.parameters())  # summed, then zeroed


def test_the_copy_keeps_the_networks_channels_last_layout(course_cnn):
    network, halves = course_cnn
    _, copy_, _ = _after_one_step(network, halves)
    conv = next(m for m in copy_.modules() if isinstance(m, nn.Conv2d))
    channels_last = next(network.parameters()).stride()
    assert conv.weight.stride() == channels_last != conv.weight.contiguous().stride()


def test_the_copys_weights_and_gradients_are_views_into_one_flat_tensor(course_cnn):
    _, copy_, _ = _after_one_step(*course_cnn)
    assert len({p.untyped_storage().data_ptr() for p in copy_.parameters()}) == 1
    assert len({p.grad.untyped_storage().data_ptr() for p in copy_.parameters()}) == 1
    assert all(p.is_leaf and p.requires_grad for p in copy_.parameters())


def test_each_view_starts_on_a_256_byte_boundary(course_cnn):
    """As allocations of their own would (CUDA kernels need it; the CUDA allocator's blocks
    start on 512 bytes)."""
    _, copy_, _ = _after_one_step(*course_cnn)
    starts = [t.data_ptr() - t.untyped_storage().data_ptr() for t in copy_.parameters()]
    assert all(start % 256 == 0 for start in starts) and len(set(starts)) == len(starts)


def test_the_networks_batch_norm_sees_its_own_half_only(course_cnn):
    """As with replicate: the copies' updates of the running statistics are dropped."""
    network, halves = course_cnn
    initial = copy.deepcopy(network)
    _after_one_step(network, halves)
    alone = copy.deepcopy(initial)
    alone(halves[0])
    for (name, ours), theirs in zip(network.named_buffers(), alone.buffers(), strict=True):
        torch.testing.assert_close(ours, theirs, msg=name)


def test_a_second_backward_without_zeroing_accumulates(course_cnn):
    """As it does through replicate."""
    network, halves = course_cnn
    replicas, _, once = _after_one_step(network, halves)
    _persistent_step(network, replicas, halves)
    for p, first in zip(network.parameters(), once, strict=True):
        torch.testing.assert_close(p.grad, 2 * first)


def test_the_copy_follows_an_optimizer_step_in_place_and_stays_the_same_object(course_cnn):
    network, halves = course_cnn
    replicas, copy_, _ = _after_one_step(network, halves)
    with torch.no_grad():
        for p in network.parameters():
            p.add_(0.5)
    again = replicas(network, CPUS)
    assert again[1] is copy_ and replicas.builds == 1
    for ours, theirs in zip(
        copy_.state_dict().values(), network.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(ours, theirs)


def test_the_copy_follows_the_networks_eval_mode(course_cnn):
    network, halves = course_cnn
    replicas, _, _ = _after_one_step(network, halves)
    network.eval()
    with torch.no_grad():
        evaluated = replicas(network, CPUS)
        assert not any(m.training for m in evaluated[1].modules()) and replicas.builds == 1
        torch.testing.assert_close(evaluated[1](halves[1]), network(halves[1]))


def test_a_parameter_the_network_gave_no_gradient_keeps_none(course_cnn):
    """The copy's gradient is zeroed all the same, not carried into the next step."""
    network, halves = course_cnn
    replicas, _, _ = _after_one_step(network, halves)
    network.zero_grad()
    copies = replicas(network, CPUS)
    replicas.sum_gradients_in_backward(copies[1](halves[1])).sum().backward()
    assert all(p.grad is None for p in network.parameters())
    assert all(not p.grad.any() for p in copies[1].parameters())


def test_a_parameter_that_is_a_new_tensor_builds_the_copies_again(course_cnn):
    network, halves = course_cnn
    replicas, copy_, _ = _after_one_step(network, halves)
    conv = next(m for m in network.modules() if isinstance(m, nn.Conv2d))
    conv.weight = nn.Parameter(conv.weight.detach().clone())
    assert replicas(network, CPUS)[1] is not copy_ and replicas.builds == 2
