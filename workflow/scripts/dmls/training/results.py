"""What a run reports: each rank's facts, and the result rank 0 hands to the supervisor
(supervisor/supervise.py writes it into the run's metrics.json)."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import statistics
from collections.abc import Iterator
from typing import Any

import torch

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
    """What training holds and uses on each of this rank's GPUs above what was resident before
    it: over the steady steps of the first epoch the trainer runs (its second half), the most
    the allocated bytes reached during a step, less what was allocated as the first step began
    (the weights and the data kept on the GPU), plus what CUDA graphs' pools hold reserved for
    their replays (`graph_pool_free_bytes`). In it is what grows with the batch (activations,
    gradients) and what training keeps from its first step on (the optimizer's state, cuDNN's
    and cuBLAS's workspaces). Left out are the first steps' one-time transients (the first
    step's trial workspaces, a graph's warm-up and capture).
    The seed's peaks stay whole: the peak before each reset is kept (`seed_peaks`)."""

    def __init__(self, gpu_indices: list[int], steps: int) -> None:
        self.gpus = gpu_indices
        self.measuring = bool(gpu_indices)
        self.steady_from = steps // 2 + 1  # (1-based) the first steady step
        self.count = 0
        self.folded = dict.fromkeys(gpu_indices, (0, 0))  # the peaks before the last reset
        self.before: dict[int, int] = {}  # GPU -> allocated as the first step began
        self.largest: dict[int, int] = {}  # GPU -> the steady steps' peak above `before`

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
            # were freed into during the capture stay reserved for the replays, and are not
            # counted as allocated.
            for i, free in graph_pool_free_bytes(self.gpus).items():
                self.largest[i] += free
        self.measuring = False

    def _fold(self) -> None:
        now = gpu_peaks(self.gpus)
        self.folded = {i: tuple(map(max, now[i], self.folded[i])) for i in self.gpus}
        reset_gpu_peaks(self.gpus)

    def seed_peaks(self) -> dict[int, tuple[int, int]]:
        """Each GPU's peak (allocated, reserved) over the whole seed."""
        now = gpu_peaks(self.gpus)
        return {i: tuple(map(max, now[i], self.folded[i])) for i in self.gpus}

    def record(self) -> dict[int, tuple[int, int]]:
        """Per GPU: (bytes held as the first step began, the steady steps' peak above them)."""
        return {i: (self.before[i], self.largest[i]) for i in self.largest}


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
    step_memory: list[dict[int, tuple[int, int]]] | None = None,
    parameters: int | None = None,
    energy_period_s: float | None = None,
) -> dict[str, Any]:
    """One seed's result from `Trainer.fit`'s outcome; `peaks` holds every rank's GPU peaks
    during the seed (`StepMemory.seed_peaks`), `step_memory` every rank's `StepMemory.record`;
    `energy_period_s` the energy counter's update period."""
    history = outcome["history"]
    n_train, n_test, manifest = loaders.n_train, loaders.n_test, loaders.manifest
    train_time = sum(h["train_time_s"] for h in history)
    last = history[-1] if history else {}
    allocated = [a for rank in peaks for a, _ in rank.values()]
    reserved = [r for rank in peaks for _, r in rank.values()]
    held = [before for rank in step_memory or [] for before, _ in rank.values()]
    above = [rise for rank in step_memory or [] for _, rise in rank.values()]
    epochs = epoch_times(history)
    return {
        "seed": seed,
        "status": outcome["status"],
        "reason": outcome["reason"],
        "history": history,
        "final": {
            "train_loss": last.get("train_loss"),
            "train_accuracy": last.get("train_accuracy"),
            "test_loss": last.get("test_loss"),
            "test_accuracy": last.get("test_accuracy"),
            "best_test_accuracy": max((h["test_accuracy"] for h in history), default=None),
            "epochs_completed": len(history),
            "stopped_early_epoch": outcome["stopped_early_epoch"],
            "diverged_epoch": outcome["diverged_epoch"],
        },
        "resumed_from_epoch": outcome["resumed_from_epoch"],
        # Finished in an earlier attempt of the job (killed during a later seed) and kept.
        "kept": False,
        # Where the seed's seconds went: building its trainer (model, optimizer, loaders, step),
        # then the epochs (train, eval, checkpoints).
        "timing": {
            "setup_s": setup_s,
            "train_time_s": train_time,
            "eval_time_s": sum(h["eval_time_s"] for h in history),
            "checkpoint_time_s": outcome["checkpoint_time_s"],
            "fit_s": fit_s,
            # The first epoch also pays for warm-up (cuDNN autotuning, graph capture, compiling);
            # the steady epoch, the median of the later ones, is what runs compare on.
            **epochs,
            "samples_per_s": throughput(n_train, epochs),
        },
        # The largest over the job's GPUs (None on CPUs), and each GPU's, rank by rank.
        "peak_gpu_mem_allocated_bytes": max(allocated, default=None),
        "peak_gpu_mem_reserved_bytes": max(reserved, default=None),
        "peak_gpu_mem_allocated_per_gpu_bytes": allocated,
        # What a step adds above what the GPUs held as it began, and that (StepMemory): the
        # largest over the GPUs.
        "gpu_mem_before_step_bytes": max(held, default=None),
        "step_gpu_mem_bytes": max(above, default=None),
        # Joules of the GPU boards, all ranks together (training/energy.py); None unmeasured.
        "energy": energy_summary(history, energy_period_s),
        "effective_precision": "/".join(sorted(set(effective_precisions))),
        "fp8_linear_layers": fp8_linear_layers,
        # The model's parameters (whole, however the strategy shards them): what DDP
        # all-reduces per step is 4 bytes each (A5's prediction from the collectives sweep).
        "parameters": parameters,
        "step": step,
        # The prepared data's identity (its arrays' SHA-256): runs compare only on the same.
        "data": {
            k: manifest.get(k) for k in ("name", "synthetic", "source", "input_shape", "sha256")
        }
        | {
            "n_train": n_train,
            # The last rows of the training arrays, held out (`validation_samples`; 0 = none).
            "n_validation": loaders.n_validation,
            "n_test": n_test,
            # Samples per epoch that no step saw, over all ranks (each drops its ragged last
            # batch), and why.
            "train_samples_unseen_per_epoch": loaders.unseen_per_epoch
            * loaders.sampler.num_replicas,
            "train_samples_unseen_reason": loaders.unseen_reason,
        },
    }


def job_result(
    seeds: list[dict[str, Any]],
    *,
    times: dict[str, float],
    world_size: int,
    ranks: list[dict[str, Any]],
    no_energy: str | None = None,
    energy_period_s: float | None = None,
) -> dict[str, Any]:
    """The job's result: every seed's (`seed_result`), and how the job's seconds went. `times`
    holds perf_counter stamps: `start`, `joined` (the process group), `fit_start` (the first
    seed's trainer built) and `fit_end` (the last seed done); `no_energy` why the GPUs' energy
    was not measured (energy.agree), None when it was. The supervisor adds the seeds'
    means and intervals (dmls/record.py)."""
    diverged = [s for s in seeds if s["status"] != "ok"]
    first = seeds[0]
    return {
        "status": "diverged" if diverged else "ok",
        "reason": "; ".join(
            s["reason"] if len(seeds) == 1 else f"seed {s['seed']}: {s['reason']}" for s in diverged
        )
        or None,
        "seeds": seeds,
        # Where the job's seconds went, in order: joining the process group, loading the data
        # and building the first seed's trainer (setup); the seeds' epochs and the later seeds'
        # trainers (fit); gathering the results, saving and leaving the group (teardown; it and
        # the wall time are set by the caller, last). train.py adds the imports before it all.
        "timing": {
            "setup_s": times["fit_start"] - times["start"],
            "process_group_s": times["joined"] - times["start"],  # of setup: NCCL's init
            "fit_s": times["fit_end"] - times["fit_start"],
            **{
                key: sum(s["timing"][key] for s in seeds if not s["kept"])
                for key in ("train_time_s", "eval_time_s", "checkpoint_time_s")
            },
            # Building the trainers of the seeds after the first (part of fit).
            "seed_setup_s": sum(s["timing"]["setup_s"] for s in seeds[1:] if not s["kept"]),
        },
        "effective_precision": "/".join(
            sorted({p for s in seeds for p in s["effective_precision"].split("/") if p})
        ),
        "fp8_linear_layers": first["fp8_linear_layers"],
        "parameters": first.get("parameters"),  # (None in a seed kept from an older version)
        "step": first["step"],
        "data": first["data"],
        "world_size": world_size,
        "ranks": ranks,
        "energy": {
            "measured": no_energy is None,
            "reason": no_energy,
            "counts": energy.COUNTS,
            "update_period_s": energy_period_s,  # (rank 0's counter, energy.update_period)
        },
    }


def epoch_times(history: list[dict[str, Any]]) -> dict[str, float | None]:
    """The first epoch's training seconds, and the steady epoch's (`steady`)."""
    seconds = [h["train_time_s"] for h in history]
    return {"first_epoch_s": seconds[0] if seconds else None, "steady_epoch_s": steady(seconds)}


def throughput(n_train: int, epochs: dict[str, float | None]) -> float | None:
    """Training samples per second of the steady epoch (of the only epoch, when there is one).
    Not over the whole training: its first epoch pays the warm-up (graph capture, compiling),
    mostly in a job's first seed, so an interval over the seeds would measure the warm-up, not
    the run (docs/performance.md, "The first seed's warm-up")."""
    seconds = epochs["steady_epoch_s"] or epochs["first_epoch_s"]
    return n_train / seconds if seconds else None


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


def steady(per_epoch: list[float]) -> float | None:
    """The steady epoch's value: the median of epochs 2..E (None with fewer than two epochs:
    every epoch there was also a warm-up)."""
    return statistics.median(per_epoch[1:]) if len(per_epoch) > 1 else None
