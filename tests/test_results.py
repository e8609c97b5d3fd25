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


def test_a_steps_memory_is_the_first_epochs_peak_above_what_its_first_batch_found(monkeypatch):
    gpu = FakeAllocator()
    gpu.install(monkeypatch)
    memory = StepMemory([0])
    gpu.alloc(100)  # weights and the data kept on the GPU
    gpu.alloc(400)  # a setup transient (e.g. a gather), gone before training
    gpu.alloc(-400)
    gpu.alloc(50)  # the epoch's prepared batches
    memory.first_batch()
    gpu.alloc(30)  # activations of a step, freed after it
    gpu.alloc(-30)
    memory.epoch_end()
    gpu.alloc(70)  # a later epoch's, not the first
    memory.epoch_end()  # only the first epoch counts
    assert memory.record() == {0: (150, 180)}
    # The seed's peak stays whole: the setup's 500 before the first batch.
    assert memory.seed_peaks() == {0: (500, 1000)}


def test_a_cpu_rank_records_no_gpu_memory():
    memory = StepMemory([])
    memory.first_batch()
    memory.epoch_end()
    assert memory.record() == {} and memory.seed_peaks() == {}
