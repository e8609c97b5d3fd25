"""GPU energy, read from NVML's total-energy counter (nvidia-ml-py).

`nvmlDeviceGetTotalEnergyConsumption` counts the millijoules a GPU board drew since the driver
loaded (Volta and newer). Each rank reads the counters of its own GPUs around every epoch's
training and its evaluation (training/trainer.py); the differences, summed over the ranks, are
the run's joules. What is counted is the GPU boards alone: not the CPUs, memory, disks or
network of the host, so it compares the GPU side of strategies and precisions, not a whole
machine's bill. Where NVML or its counter is missing (a CPU run, no driver, an older GPU), no
rank measures anything and the reason is recorded instead of a number.

The counter moves in steps: NVML updates it on its own schedule (every 100 ms on an H100,
driver 580: 30 changes in 3 s, gaps 97-103 ms), and a reading is its last update. Both
readings of a window lag by up to one update, so its joules are off by up to one update's
worth, and a window of k updates by up to 1/k of itself: a 0.2 s epoch reads within ±50%, and
an evaluation of 0.03 s read 0 J or one update's joules. The meter measures the update period
when first asked. A steady epoch's joules are the mean over epochs 2..E, where these errors fall
at random phases and average out (what is left shows in the seeds' spread), and are given only
when those epochs span `MIN_UPDATES` updates together (results.energy_summary); sums over a
seed's whole training span many more.
"""

from __future__ import annotations

import functools
import time
from typing import Any

# What the joules cover, as metrics.json says it.
COUNTS = "GPU boards only (NVML total-energy counter), not CPUs, host memory or network"
# A steady epoch's joules are given when epochs 2..E span this many counter updates.
MIN_UPDATES = 10
# Every rank's GPUs must report energy, or the run's sum would leave some out.
_SOME_RANKS = "not every rank's GPUs report energy"


class EnergyMeter:
    """The total-energy counters of one rank's GPUs."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml, self._handles = nvml, handles

    @functools.cached_property
    def update_period_s(self) -> float | None:
        """Seconds between the counter's updates (None: it did not move twice while measured),
        measured on the first GPU when first asked (0.1-0.2 s on an H100 or H200). Only the rank
        that writes the results asks, after its first seed has trained, outside the epochs'
        timed windows."""
        read = functools.partial(self._nvml.nvmlDeviceGetTotalEnergyConsumption, self._handles[0])
        return update_period(read)

    @classmethod
    def open(cls, gpu_indices: list[int]) -> tuple[EnergyMeter | None, str | None]:
        """(meter, None) for this rank's CUDA devices `gpu_indices`, or (None, why not)."""
        if not gpu_indices:
            return None, "a CPU run: NVML counts GPU energy only"
        try:
            import pynvml
        except ImportError:
            return None, "nvidia-ml-py (pynvml) is not installed"
        import torch

        try:
            pynvml.nvmlInit()
            # By UUID: CUDA's device numbers follow CUDA_VISIBLE_DEVICES, NVML's do not.
            handles = [
                pynvml.nvmlDeviceGetHandleByUUID(_nvml_uuid(torch.cuda.get_device_properties(i)))
                for i in gpu_indices
            ]
            for handle in handles:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except pynvml.NVMLError as e:
            return None, f"NVML has no energy counter here: {e}"
        return cls(pynvml, handles), None

    def joules(self) -> float:
        """The counters' sum, in joules (a difference of two readings is the energy between)."""
        return sum(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles) / 1e3


def update_period(read: Any, timeout_s: float = 0.5) -> float | None:
    """Seconds between two successive changes of the counter that `read()` returns, or None
    when it did not change twice within `timeout_s` (an idle board still draws, so it moves)."""
    last_change = None
    value = read()
    begin = time.perf_counter()
    while (now := time.perf_counter()) - begin < timeout_s:
        current = read()
        if current != value:
            value = current
            if last_change is not None:
                return now - last_change
            last_change = now
    return None


def resolution_reason(seconds: float, epochs: int, period_s: float | None) -> str | None:
    """Why epochs 2..`epochs`, which trained for `seconds` in all, are too short for the counter
    to give a steady epoch's joules, or None when they span `MIN_UPDATES` updates (or the
    period is unknown)."""
    if period_s is None or seconds >= MIN_UPDATES * period_s:
        return None
    return (
        f"epochs 2–{epochs} trained for {seconds:.2f} s in all, fewer than {MIN_UPDATES} of "
        f"the energy counter's updates (every {1e3 * period_s:.0f} ms)"
    )


def agree(
    meter: EnergyMeter | None, reasons: list[str | None]
) -> tuple[EnergyMeter | None, str | None]:
    """The meter this rank uses, given every rank's reason for having none (None where it has
    one): a run measures only when all its ranks do, so that their sum is the run's energy.
    (meter or None, why not), the same verdict on every rank."""
    missing = [r for r in reasons if r is not None]
    if not missing:
        return meter, None
    if len(missing) < len(reasons):
        return None, f"{_SOME_RANKS}: {missing[0]}"
    return None, missing[0]


def _nvml_uuid(properties: Any) -> str:
    """NVML's spelling of a device's UUID ('GPU-…'), from torch's device properties."""
    uuid = str(properties.uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
