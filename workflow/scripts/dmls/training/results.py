"""What a rank measures for the run's record: where it ran, its GPUs' memory (`StepMemory`), a
seed's energy; rank 0 hands each seed's numbers to record.new_seed, which gives them their keys
(dmls/record.py builds the record; supervisor/supervise.py writes it)."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import statistics
from collections.abc import Iterator
from typing import Any, cast

import torch

from dmls import record
from dmls.data.loaders import Loaders
from dmls.training import energy
from dmls.training.parallel import Process


def rank_facts(process: Process, gpu_indices: list[int]) -> dict[str, Any]:
    """Where this rank ran, what host memory it used at most (its GPUs' memory is each seed's:
    `seed_result`) and how often it was preempted."""
    gpus = [{"index": i, "name": torch.cuda.get_device_name(i)} for i in gpu_indices]
    usage = resource.getrusage(resource.RUSAGE_SELF)  # all of the process's threads
    return {
        "rank": process.rank,
        "local_rank": process.local_rank,
        "node_rank": process.node_rank,
        "hostname": socket.gethostname(),
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "device": str(process.device),
        "gpus": gpus,
        # Where the rank was allowed to run (a local run's reservation, or Slurm's allocation).
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        # ru_maxrss is in KiB on Linux; DataLoader workers are separate processes, not counted.
        "peak_host_rss_bytes": usage.ru_maxrss * 1024,
        # Times the kernel took a core from this process's threads while they could still run
        # (over the whole job): many more than a lone process's mean more runnable threads
        # than cores, e.g. OpenMP threads spinning beside gloo's (B1).
        "involuntary_context_switches": usage.ru_nivcsw,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),  # as the rank got it
    }


def reset_gpu_peaks(gpu_indices: list[int]) -> None:
    """Start a seed's peak memory afresh on this rank's GPUs."""
    for i in gpu_indices:
        torch.cuda.reset_peak_memory_stats(i)


def gpu_peaks(gpu_indices: list[int]) -> dict[int, tuple[int, int]]:
    """Peak (allocated, reserved) bytes of this rank's GPUs since the last reset."""
    return {
        i: (torch.cuda.max_memory_allocated(i), torch.cuda.max_memory_reserved(i))
        for i in gpu_indices
    }


def graph_pool_free_bytes(gpus: list[int]) -> dict[int, int]:
    """Per GPU: the bytes CUDA graphs' private pools hold reserved but not allocated (the
    caching allocator's segments of a pool other than the default one)."""
    free = dict.fromkeys(gpus, 0)
    for segment in torch.cuda.memory_snapshot():
        pool = tuple(segment.get("segment_pool_id") or (0, 0))
        if segment["device"] in free and pool != (0, 0):
            free[segment["device"]] += segment["total_size"] - segment["allocated_size"]
    return free


class StepMemory:
    """What a training step adds on each of this rank's GPUs, in allocated bytes only (the
    course's kind of memory): over the steady steps of the first epoch the trainer runs (its
    second half), the most the allocated bytes reached during a step, less what was allocated
    as the first step began (the weights and the data kept on the GPU). In it is what grows with
    the batch (activations, gradients) and what training keeps from its first step on (the
    optimizer's state, cuDNN's and cuBLAS's workspaces). Left out are the first steps' one-time
    transients (the first step's trial workspaces, a graph's warm-up and capture). So before the
    step plus what it adds is at most the seed's allocated peak, on every GPU.
    Named apart, not added: the bytes CUDA graphs' private pools hold reserved for their
    replays (`graph_pool_free_bytes`, at the first epoch's end): a replayed step's activations
    live there and are never counted as allocated.
    The seed's peaks stay whole: the peak before each reset is kept (`seed_peaks`)."""

    def __init__(self, gpu_indices: list[int], steps: int) -> None:
        self.gpus = gpu_indices
        self.measuring = bool(gpu_indices)
        self.steady_from = steps // 2 + 1  # (1-based) the first steady step
        self.count = 0
        self.folded = dict.fromkeys(gpu_indices, (0, 0))  # the peaks before the last reset
        self.before: dict[int, int] = {}  # GPU -> allocated as the first step began
        self.largest: dict[int, int] = {}  # GPU -> the steady steps' peak above `before`
        self.pool: dict[int, int] = {}  # GPU -> CUDA graphs' pools, reserved not allocated

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        if not self.measuring:
            yield
            return
        self.count += 1
        if self.count == 1:
            self.before = {i: torch.cuda.memory_allocated(i) for i in self.gpus}
        steady = self.count >= self.steady_from
        if steady:
            self._fold()
        yield
        if steady:
            for i in self.gpus:
                above = torch.cuda.max_memory_allocated(i) - self.before[i]
                self.largest[i] = max(above, self.largest.get(i, 0))

    def epoch_end(self) -> None:
        if self.measuring and self.largest:
            # A captured step replays in its graph's private pool: the blocks its activations
            # were freed into during the capture stay reserved for the replays.
            self.pool = graph_pool_free_bytes(self.gpus)
        self.measuring = False

    def _fold(self) -> None:
        now = gpu_peaks(self.gpus)
        self.folded = {
            i: cast("tuple[int, int]", tuple(map(max, now[i], self.folded[i])))  # two maxima
            for i in self.gpus
        }
        reset_gpu_peaks(self.gpus)

    def seed_peaks(self) -> dict[int, tuple[int, int]]:
        """Each GPU's peak (allocated, reserved) over the whole seed."""
        now = gpu_peaks(self.gpus)
        return {
            i: cast("tuple[int, int]", tuple(map(max, now[i], self.folded[i])))  # two maxima
            for i in self.gpus
        }

    def record(self) -> dict[int, tuple[int, int, int]]:
        """Per GPU: (bytes allocated as the first step began, the steady steps' allocated peak
        above them, the bytes CUDA graphs' pools held reserved but not allocated)."""
        return {i: (self.before[i], self.largest[i], self.pool.get(i, 0)) for i in self.largest}


def seed_result(
    seed: int,
    outcome: dict[str, Any],
    *,
    loaders: Loaders,
    setup_s: float,
    fit_s: float,
    effective_precisions: list[str],
    fp8_linear_layers: int,
    step: dict[str, Any],
    peaks: list[dict[int, tuple[int, int]]],
    step_memory: list[dict[int, tuple[int, int, int]]] | None = None,
    parameters: int | None = None,
    energy_period_s: float | None = None,
    layers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One seed's record (record.new_seed) from `Trainer.fit`'s outcome; `peaks` holds every
    rank's GPU peaks during the seed (`StepMemory.seed_peaks`), `step_memory` every rank's
    `StepMemory.record`; `energy_period_s` the energy counter's update period."""
    manifest = loaders.manifest
    return record.new_seed(
        seed,
        outcome,
        n_train=loaders.n_train,
        setup_s=setup_s,
        fit_s=fit_s,
        peaks=[peak for rank in peaks for peak in rank.values()],
        step_memory=[memory for rank in step_memory or [] for memory in rank.values()],
        energy=energy_summary(outcome["history"], energy_period_s),
        effective_precisions=effective_precisions,
        fp8_linear_layers=fp8_linear_layers,
        parameters=parameters,
        layers=layers,
        step=step,
        data={k: manifest.get(k) for k in ("name", "synthetic", "source", "input_shape", "sha256")}
        | {
            "n_train": loaders.n_train,
            # The last rows of the training arrays, held out (`validation_samples`; 0 = none).
            "n_validation": loaders.n_validation,
            "n_test": loaders.n_test,
            # Distinct samples per epoch that no step of any rank saw (each drops its ragged
            # last batch; the sampler's padding copies not counted), and why.
            "train_samples_unseen_per_epoch": loaders.unseen_per_epoch,
            "train_samples_unseen_reason": loaders.unseen_reason,
        },
    )


def job_energy(no_energy: str | None, energy_period_s: float | None) -> dict[str, Any]:
    """Whether the job measured the GPUs' energy (`no_energy`: why not, energy.agree) and how
    (rank 0's counter's update period, energy.update_period)."""
    return {
        "measured": no_energy is None,
        "reason": no_energy,
        "counts": energy.COUNTS,
        "update_period_s": energy_period_s,
    }


def energy_summary(
    history: list[dict[str, Any]], update_period_s: float | None = None
) -> dict[str, Any] | None:
    """A seed's joules from its epochs (`train_energy_j`, `eval_energy_j`, training/energy.py):
    in training, in evaluation, and per steady epoch: the mean of epochs 2..E's training joules
    (a mean, not the median the steady time takes: each epoch's reading is off by up to one of
    the counter's updates, and a mean averages that over the epochs). That is None, with the
    reason (`steady_epoch_energy_reason`), when epochs 2..E together are too short for the
    counter's `update_period_s` (energy.resolution_reason). None unless every epoch was
    measured (a seed resumed on a host without the counter)."""
    if not history or any("train_energy_j" not in h for h in history):
        return None
    train = [h["train_energy_j"] for h in history]
    later = history[1:]
    too_short = later and energy.resolution_reason(
        sum(h["train_time_s"] for h in later), len(history), update_period_s
    )
    return {
        "train_energy_j": sum(train),
        "eval_energy_j": sum(h["eval_energy_j"] for h in history),
        "steady_epoch_energy_j": None if too_short or not later else statistics.fmean(train[1:]),
        "steady_epoch_energy_reason": too_short or None,
    }
