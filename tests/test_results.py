"""What a run reports (dmls/training/results.py)."""

import torch

from dmls.record import epoch_times
from dmls.training.results import StepMemory


def test_the_steady_epoch_is_the_median_after_the_warm_up_epoch():
    history = [{"train_time_s": s} for s in (9.0, 1.0, 3.0, 2.0)]
    assert epoch_times(history) == {"first_epoch_s": 9.0, "steady_epoch_s": 2.0}
    assert epoch_times(history[:1]) == {"first_epoch_s": 9.0, "steady_epoch_s": None}
    assert epoch_times([]) == {"first_epoch_s": None, "steady_epoch_s": None}


class FakeAllocator:
    """torch.cuda's memory counters of one GPU, driven by hand."""

    def __init__(self) -> None:
        self.allocated, self.peak, self.reserved_peak = 0, 0, 0
        self.segments: list[dict] = []  # the caching allocator's segments (memory_snapshot)

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)
        self.reserved_peak = max(self.reserved_peak, 2 * self.allocated)

    def install(self, monkeypatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "memory_allocated", lambda i: self.allocated)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda i: self.peak)
        monkeypatch.setattr(cuda, "max_memory_reserved", lambda i: self.reserved_peak)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(cuda, "memory_snapshot", lambda: self.segments)

    def reset(self, i: int) -> None:
        self.peak, self.reserved_peak = self.allocated, 2 * self.allocated


def test_training_memory_is_the_steady_steps_peak_above_what_the_first_step_found_held(
    monkeypatch,
):
    """Before: the most any step rose above its own start, which the first step's one-time
    workspaces (cuDNN's autotuning: tens of MiB whatever the batch) decided."""
    gpu = FakeAllocator()
    gpu.install(monkeypatch)
    memory = StepMemory([0], steps=4)  # steps 3 and 4 are steady
    gpu.alloc(100)  # weights and the data kept on the GPU
    gpu.alloc(400)  # a setup transient (e.g. a gather), gone before training
    gpu.alloc(-400)
    for k, (transient, kept, activations) in enumerate(((70, 5, 30), (0, 0, 30), (0, 0, 30),
                                                        (0, 0, 40))):  # fmt: skip
        with memory.step():
            gpu.alloc(transient)  # the first step's autotuning workspace
            gpu.alloc(-transient)
            gpu.alloc(kept)  # the optimizer's state, made in the first step and kept
            gpu.alloc(activations)  # the step's, freed after it
            gpu.alloc(-activations)
        gpu.alloc(200 if k == 2 else 0)  # the data pipeline's work between steps: not a step's
        gpu.alloc(-200 if k == 2 else 0)
    memory.epoch_end()
    with memory.step():  # a later epoch's steps are not measured
        gpu.alloc(500)
        gpu.alloc(-500)
    assert memory.record() == {0: (100, 45, 0)}  # the kept state (5) and the steady step's 40
    # The seed's peak stays whole: the setup's 500, then the later epoch's 605.
    assert memory.seed_peaks() == {0: (605, 1210)}


def test_a_captured_steps_graph_pool_is_named_apart_from_what_it_allocates(monkeypatch):
    """A CUDA graph's activations live in its private pool: freed into it during the capture,
    reserved for every replay, and not counted as allocated (measured on an H200: the graph
    runs' allocated bytes stayed flat from batch 32 to 128). What the step adds stays allocated
    bytes only, so that with what was held before it it fits under the allocated peak; the
    pool's free bytes are named apart (version 3 added them in, and the two exceeded the peak)."""
    gpu = FakeAllocator()
    gpu.install(monkeypatch)
    memory = StepMemory([0], steps=2)
    gpu.alloc(100)
    for _ in range(2):
        with memory.step():
            gpu.alloc(10)  # a replay's outputs, in the pool and allocated
            gpu.alloc(-10)
    gpu.segments = [
        {"device": 0, "segment_pool_id": (0, 0), "total_size": 200, "allocated_size": 100},
        {"device": 0, "segment_pool_id": (1, 0), "total_size": 64, "allocated_size": 16},
        {"device": 1, "segment_pool_id": (1, 0), "total_size": 999, "allocated_size": 0},
    ]
    memory.epoch_end()
    assert memory.record() == {0: (100, 10, 48)}
    held, added, _ = memory.record()[0]
    assert held + added <= memory.seed_peaks()[0][0]


def test_a_cpu_rank_records_no_gpu_memory():
    memory = StepMemory([], steps=1)
    with memory.step():
        pass
    memory.epoch_end()
    assert memory.record() == {} and memory.seed_peaks() == {}
