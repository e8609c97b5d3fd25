"""The step objects (dmls/training/steps.py): why a run steps eagerly, what an eager step adds
up, and which micro-steps CapturedStep runs eagerly, captures and replays.

CUDA graphs need a GPU (tests/test_engine_cuda.py trains with real ones); here a stand-in graph
records the captured call and re-runs it on replay, which is what a CUDA graph does with the
kernels it recorded: same function, the static input tensors' current content.
"""

import contextlib

import pytest
import torch
from torch import nn

from conftest import make_spec
from dmls.training.faults import Drill, Fault
from dmls.training.parallel import strategy_for
from dmls.training.precision import Autocast
from dmls.training.steps import CapturedStep, EagerStep, build_step, eager_reason

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


def reason(spec, device=GPU, drill=False):
    return eager_reason(spec, strategy_for(spec), device, fault_drill=drill)


def test_a_run_says_why_its_step_is_not_a_cuda_graph():
    spec = make_spec(device="cpu")
    assert spec.step == "graph" and spec.loader == "device"  # the schema's defaults
    assert reason(spec, CPU) == "CUDA graphs need a GPU; this run trains on the CPU"
    assert reason(make_spec(launcher="dp", nproc_per_node=2, grad_accum_steps=2), drill=True) == (
        "DataParallel copies the model to its GPUs from Python in every step; a DMLS_FAULT "
        "drill changes the step from Python"
    )
    gloo = make_spec(launcher="torchrun", nproc_per_node=2, backend="gloo")
    assert reason(gloo).startswith("gloo all-reduces")
    assert reason(make_spec(launcher="torchrun", nproc_per_node=2, backend="nccl")) is None
    accumulated = make_spec(
        launcher="torchrun", nproc_per_node=2, backend="nccl", grad_accum_steps=4
    )
    assert reason(accumulated) is None
    accelerate = make_spec(launcher="accelerate", nproc_per_node=2, backend="gloo")
    assert reason(accelerate) == (
        "accelerate prepares the model, optimizer and scaler its own way; gloo all-reduces "
        "CUDA tensors through host memory, which a CUDA graph can't capture"
    )
    assert reason(make_spec(precision="fp8", batch_size=32)) is None
    assert reason(make_spec(step="eager")) == "step: eager"
    assert reason(make_spec()) is None


def eager_step(spec, drill=None):
    """A real eager step of a tiny linear model on the CPU, prepared by the spec's strategy."""
    torch.manual_seed(0)
    strategy = strategy_for(spec)
    strategy.join()
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    module, optimizer, _ = strategy.prepare(model, optimizer, None)
    autocast = Autocast("cpu", None, cache_enabled=True)
    step = build_step(
        spec, stream=None, reason="because", drill=drill, module=module, strategy=strategy,
        optimizer=optimizer, criterion=nn.CrossEntropyLoss(), autocast=autocast, device=CPU,
    )  # fmt: skip
    return step, model


def test_an_eager_step_adds_up_its_micro_batches_and_divides_their_loss():
    spec = make_spec(device="cpu", grad_accum_steps=2)
    step, model = eager_step(spec)
    assert isinstance(step, EagerStep) and not step.compiled
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    step(x, y, sync=False, divisor=2)
    step(x, y, sync=True, divisor=2)
    # Two halves of the same batch's loss add up to one whole: the gradient of one step.
    accumulated = model.weight.grad.clone()
    step.after_optimizer_step()
    assert model.weight.grad is None  # cleared as the eager step clears it
    step(x, y, sync=True, divisor=1)
    torch.testing.assert_close(accumulated, model.weight.grad)
    loss = nn.functional.cross_entropy(model(x), y).item()
    assert step.sums[2].item() == 12 and step.sums[0].item() == pytest.approx(3 * 4 * loss)
    assert step.record() == {"mode": "eager", "eager_reason": "because"}


def test_a_drill_fires_in_the_micro_step_halfway_through_its_epoch():
    drill = Drill(Fault(rank=0, epoch=2, kind="nan"), "t/r", rank=0)
    step, _ = eager_step(make_spec(device="cpu"), drill=drill)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    for epoch in (1, 2):
        drill.start_epoch(epoch, micro_steps=5)
        step.sums.zero_()
        for i in range(5):
            step(x, y, sync=True, divisor=1)
            assert torch.isfinite(step.sums[0]) == (epoch == 1 or i < 2), (epoch, i)


class RecordingGraph:
    """Captures the call made inside `torch.cuda.graph(self)` and re-runs it on replay."""

    def __init__(self):
        self.call = None

    def replay(self):
        self.call()


@pytest.fixture
def fake_cuda_graphs(monkeypatch):
    capturing = []

    @contextlib.contextmanager
    def graph(g, stream=None):
        capturing.append(g)
        yield
        capturing.pop()

    monkeypatch.setattr(torch.cuda, "CUDAGraph", RecordingGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    return capturing


class ZeroCounter:
    """An optimizer of one parameter that counts how its gradients were cleared."""

    def __init__(self):
        self.param_groups = [{"params": [nn.Parameter(torch.zeros(2))]}]
        self.cleared = []

    def zero_grad(self, set_to_none=True):
        self.cleared.append("none" if set_to_none else "in place")


class Logged:
    """An inner step that logs what it saw: ('eager'|'replay', first x value, sync)."""

    compiled = False

    def __init__(self, capturing):
        self.capturing, self.log, self.optimizer = capturing, [], ZeroCounter()
        self.sums = torch.zeros(3)

    def __call__(self, x, y, sync, divisor):
        if self.capturing:
            graph = self.capturing[-1]
            # What the graph replays: the static tensors, read at replay time.
            graph.call = lambda: self.log.append(("replay", int(x[0, 0]), sync))
        else:
            self.log.append(("eager", int(x[0, 0]), sync))

    def after_optimizer_step(self):
        self.optimizer.zero_grad(set_to_none=True)


def batch(i, size=4):
    return torch.full((size, 3), i), torch.zeros(size, dtype=torch.long)


def run(step, syncs, sizes=None, divisors=None):
    for i, sync in enumerate(syncs):
        step(*batch(i, (sizes or {}).get(i, 4)), sync=sync, divisor=(divisors or {}).get(i, 1))


def test_without_accumulation_one_graph_replays_each_new_batch(fake_cuda_graphs):
    inner = Logged(fake_cuda_graphs)
    step = CapturedStep(inner, 2, None, batch_size=4)
    run(step, [True] * 6, sizes={5: 3})  # the last batch is ragged
    assert inner.log == [
        ("eager", 0, True), ("eager", 1, True),  # warm-up
        ("replay", 2, True),  # captured, then replayed once at once
        ("replay", 3, True), ("replay", 4, True),
        ("eager", 5, True),  # ragged: eager, after clearing what the replays left
    ]  # fmt: skip
    assert inner.optimizer.cleared == ["in place"]
    step.after_optimizer_step()  # a replay overwrites every gradient: nothing to clear
    assert inner.optimizer.cleared == ["in place"]
    assert step.record() == {
        "captured": True, "graphs": 1, "eager_steps": 3, "replayed_steps": 3,
        "mode": "cuda_graph", "eager_reason": None,
    }  # fmt: skip


def test_with_accumulation_a_no_sync_and_a_sync_graph_are_captured(fake_cuda_graphs):
    inner = Logged(fake_cuda_graphs)
    step = CapturedStep(inner, 2, None, batch_size=4, divisor=3)
    # Groups of 3 micro-steps: sync on every third. Warm-up is 2 optimizer steps (6 micro).
    syncs = [False, False, True] * 4
    run(step, syncs, sizes={11: 2}, divisors=dict.fromkeys(range(12), 3))
    assert inner.log[:6] == [("eager", i, s) for i, s in enumerate(syncs[:6])]
    assert inner.log[6:] == [
        ("replay", 6, False), ("replay", 7, False),  # the no-sync graph, captured at 6
        ("replay", 8, True),  # the sync graph, captured at 8
        ("replay", 9, False), ("replay", 10, False),
        ("eager", 11, True),  # ragged
    ]  # fmt: skip
    # The gradients are allocated once, before the first capture, and never cleared by it:
    # the micro-steps of a group add into them; the optimizer step zeroes them in place.
    assert inner.optimizer.cleared == ["in place"]
    step.after_optimizer_step()
    assert inner.optimizer.cleared == ["in place", "in place"]
    assert step.record()["eager_steps"] == 7 and step.record()["replayed_steps"] == 5


def test_a_last_short_group_runs_eagerly_with_its_own_divisor_and_uncounted(fake_cuda_graphs):
    inner = Logged(fake_cuda_graphs)
    step = CapturedStep(inner, 1, None, batch_size=4, divisor=2)
    # 5 micro-batches in groups of 2: the fifth is a group of its own (divisor 1).
    run(step, [False, True, False, True, True], divisors={0: 2, 1: 2, 2: 2, 3: 2, 4: 1})
    assert [kind for kind, _, _ in inner.log] == ["eager", "eager", "replay", "replay", "eager"]
    assert step.record()["eager_steps"] == 2


def test_a_ragged_batch_is_never_the_captured_shape(fake_cuda_graphs):
    inner = Logged(fake_cuda_graphs)
    step = CapturedStep(inner, 1, None, batch_size=4)
    run(step, [True] * 4, sizes={1: 2})  # warm-up ends on a ragged batch
    assert [kind for kind, _, _ in inner.log] == ["eager", "eager", "replay", "replay"]


def test_before_any_capture_the_inner_step_clears_the_gradients(fake_cuda_graphs):
    inner = Logged(fake_cuda_graphs)
    step = CapturedStep(inner, 5, None, batch_size=4)
    run(step, [True] * 2)
    step.after_optimizer_step()
    assert inner.optimizer.cleared == ["none"]
    assert step.record() == {
        "captured": False, "graphs": 0, "eager_steps": 2, "replayed_steps": 0,
        "mode": "eager", "eager_reason": "no epoch had more than 5 full batches to warm up",
    }  # fmt: skip
