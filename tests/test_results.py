"""What a run reports (dmls/training/results.py)."""

import torch

from dmls.training.results import StepMemory, epoch_times


def test_the_steady_epoch_is_the_median_after_the_warm_up_epoch():
    history = [{"train_time_s": s} for s in (9.0, 1.0, 3.0, 2.0)]
    assert epoch_times(history) == {"first_epoch_s": 9.0, "steady_epoch_s": 2.0}
    assert epoch_times(history[:1]) == {"first_epoch_s": 9.0, "steady_epoch_s": None}
    assert epoch_times([]) == {"first_epoch_s": None, "steady_epoch_s": None}


class FakeAllocator:
    """torch.cuda's memory counters of one GPU, driven by hand."""

    def __init__(self) -> None:
        self.allocated, self.peak, self.reserved_peak = 0, 0, 0

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

    def reset(self, i: int) -> None:
        self.peak, self.reserved_peak = self.allocated, 2 * self.allocated


def test_a_steps_memory_is_the_most_a_step_of_the_first_epoch_raised_the_allocated_bytes(
    monkeypatch,
):
    gpu = FakeAllocator()
    gpu.install(monkeypatch)
    memory = StepMemory([0])
    gpu.alloc(100)  # weights and the data kept on the GPU
    gpu.alloc(400)  # a setup transient (e.g. a gather), gone before training
    gpu.alloc(-400)
    for activations, pipeline in ((30, 200), (60, 0)):
        with memory.step():
            gpu.alloc(activations)  # the step's, freed after it
            gpu.alloc(-activations)
        gpu.alloc(pipeline)  # the data pipeline's work between steps: not a step's
        gpu.alloc(-pipeline)
    gpu.alloc(50)  # the optimizer's state, kept from here on
    memory.epoch_end()
    with memory.step():  # a later epoch's steps are not measured
        gpu.alloc(500)
        gpu.alloc(-500)
    assert memory.record() == {0: (100, 60)}
    # The seed's peak stays whole: the setup's 500, then the later epoch's 650.
    assert memory.seed_peaks() == {0: (650, 1300)}


def test_a_cpu_rank_records_no_gpu_memory():
    memory = StepMemory([])
    with memory.step():
        pass
    memory.epoch_end()
    assert memory.record() == {} and memory.seed_peaks() == {}
