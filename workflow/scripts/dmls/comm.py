"""What collectives cost, from a measured sweep (special study `collectives`, A5 explained):
the latency at any message size, and DDP's buckets. Torch-free, for the report as well."""

from __future__ import annotations

from typing import Any

import numpy as np

# DDP's defaults (torch.nn.parallel.DistributedDataParallel): the first bucket is small, so the
# all-reduce starts early in the backward; the others hold up to bucket_cap_mb = 25 MiB.
DDP_FIRST_BUCKET_BYTES = 1 * 2**20
DDP_BUCKET_BYTES = 25 * 2**20


def latency_at(
    rows: list[dict[str, Any]], size: float, *, extrapolate: bool = True
) -> float | None:
    """The latency (µs) of one call at `size` bytes: interpolated log-log between the measured
    sizes; past the largest, at the largest one's bandwidth (large messages are bandwidth-bound)
    unless `extrapolate` is off; None below the smallest or without a measured size."""
    points = sorted((r["size_bytes"], r["latency_us"]) for r in rows if r["status"] == "ok")
    if not points or size < points[0][0] or (size > points[-1][0] and not extrapolate):
        return None
    if size > points[-1][0]:
        return points[-1][1] * size / points[-1][0]
    xs, ys = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    return float(np.exp(np.interp(np.log(size), xs, ys)))


def ddp_buckets(gradient_bytes: int) -> list[int]:
    """The sizes DDP all-reduces a gradient of `gradient_bytes` in (bucket boundaries fall
    between parameters, so these are the nominal sizes)."""
    first = min(gradient_bytes, DDP_FIRST_BUCKET_BYTES)
    full, rest = divmod(gradient_bytes - first, DDP_BUCKET_BYTES)
    return [first] + [DDP_BUCKET_BYTES] * full + ([rest] if rest else [])


def setup_rows(
    sweep: list[dict[str, Any]], backend: str, device: str, processes: int
) -> list[dict[str, Any]]:
    """The sweep's measured rows of one backend, tensor device and number of processes, with
    the ranks on one host as a run of the engine places them (not the sweeps between nodes;
    a sweep from before placements has no `placement`)."""
    return [
        r
        for r in sweep
        if r["status"] == "ok"
        and (r["backend"], r["device"], r["processes"]) == (backend, device, processes)
        and r.get("placement", "host") == "host"
    ]


def calls_ms(sweep: list[dict[str, Any]], calls: list[tuple[str, int]]) -> float | None:
    """Milliseconds of `calls` ((op, bytes) each) one after another, from the sweep's rows of one
    setup (`setup_rows`); None when it lacks an op or a size."""
    total = 0.0
    for op, size in calls:
        at = latency_at([r for r in sweep if r["op"] == op], size)
        if at is None:
            return None
        total += at
    return total / 1000
