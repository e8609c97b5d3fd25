"""Which micro-steps CapturedStep runs eagerly, captures and replays, and what a replay reads.

CUDA graphs need a GPU (tests/test_engine_cuda.py trains with real ones); here a stand-in graph
records the captured call and re-runs it on replay, which is what a CUDA graph does with the
kernels it recorded: same function, the static input tensors' current content.
"""

import contextlib

import pytest
import torch

from dmls.training.steps import CapturedStep


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


class Steps:
    """A micro-step that logs what it saw: ('eager'|'capture', first x value, sync)."""

    def __init__(self, capturing):
        self.capturing, self.log, self.zeroed = capturing, [], 0

    def __call__(self, x, y, sync):
        if self.capturing:
            graph = self.capturing[-1]
            # What the graph replays: the static tensors, read at replay time.
            graph.call = lambda: self.log.append(("replay", int(x[0, 0]), sync))
        else:
            self.log.append(("eager", int(x[0, 0]), sync))

    def zero_grads(self):
        self.zeroed += 1


def batch(i, size=4):
    return torch.full((size, 3), i), torch.zeros(size, dtype=torch.long)


def run(step, syncs, sizes=None):
    for i, sync in enumerate(syncs):
        step(*batch(i, (sizes or {}).get(i, 4)), sync=sync)


def test_without_accumulation_one_graph_replays_each_new_batch(fake_cuda_graphs):
    steps = Steps(fake_cuda_graphs)
    step = CapturedStep(steps, steps.zero_grads, 2, None, batch_size=4)
    run(step, [True] * 6, sizes={5: 3})  # the last batch is ragged
    assert steps.log == [
        ("eager", 0, True), ("eager", 1, True),  # warm-up
        ("replay", 2, True),  # captured, then replayed once at once
        ("replay", 3, True), ("replay", 4, True),
        ("eager", 5, True),  # ragged: eager, after clearing what the replays left
    ]  # fmt: skip
    assert steps.zeroed == 1
    assert step.summary == {"captured": True, "graphs": 1, "eager_steps": 3, "replayed_steps": 3}


def test_with_accumulation_a_no_sync_and_a_sync_graph_are_captured(fake_cuda_graphs):
    steps = Steps(fake_cuda_graphs)
    step = CapturedStep(steps, steps.zero_grads, 2, None, batch_size=4, accumulate=True)
    # Groups of 3 micro-steps: sync on every third. Warm-up is 2 optimizer steps (6 micro).
    syncs = [False, False, True] * 4
    run(step, syncs, sizes={11: 2})
    assert steps.log[:6] == [("eager", i, s) for i, s in enumerate(syncs[:6])]
    assert steps.log[6:] == [
        ("replay", 6, False), ("replay", 7, False),  # the no-sync graph, captured at 6
        ("replay", 8, True),  # the sync graph, captured at 8
        ("replay", 9, False), ("replay", 10, False),
        ("eager", 11, True),  # ragged
    ]  # fmt: skip
    # The gradients are allocated once, before the first capture, and never cleared by it:
    # the micro-steps of a group add into them (the optimizer step zeroes them).
    assert steps.zeroed == 1
    assert step.summary == {"captured": True, "graphs": 2, "eager_steps": 7, "replayed_steps": 5}


def test_a_ragged_batch_is_never_the_captured_shape(fake_cuda_graphs):
    steps = Steps(fake_cuda_graphs)
    step = CapturedStep(steps, steps.zero_grads, 1, None, batch_size=4)
    run(step, [True] * 4, sizes={1: 2})  # warm-up ends on a ragged batch
    assert [kind for kind, _, _ in steps.log] == ["eager", "eager", "replay", "replay"]
