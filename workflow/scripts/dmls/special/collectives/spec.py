"""The declaration of A5 explained (the collectives' sweep, measured by
measure.py beside it): the facts its answer is filled from and what its report section
shows (dmls/study_spec.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dmls.comm import latency_at
from dmls.report.cells import data_name
from dmls.report.comparisons import NotMeasured
from dmls.report.phrases import Phrase, join
from dmls.report.special_answers import (
    finished_rows,
    not_measured,
    skip_reason,
)
from dmls.report.study import OK
from dmls.report.wording import fmt_num, fmt_size
from dmls.study_spec import Facts, StudySpec, Table

# A5 explained: how the sweep's setups are named in a sentence.
BACKENDS = {"nccl": "NCCL", "gloo": "Gloo"}


TENSORS = {"cuda": "CUDA tensors", "cpu": "CPU tensors"}


PLACEMENTS = {"host": "", "nodes": " over two emulated nodes", "slurm": " over two Slurm nodes"}


def facts(summary: dict[str, Any], folder: Path) -> Facts:
    """A5 explained, at the fewest processes that ran: each setup's all-reduce latency at the
    smallest message and bus bandwidth at the largest; and Gloo against NCCL (a speed: NCCL's
    time over Gloo's) at the sweep's size nearest the course CNN's gradient (on a log scale).
    Cases: "compared", or "no_nccl" where NCCL did not run."""
    rows = finished_rows(summary)
    ok = [r for r in rows if r["status"] == OK and r["op"] == "all_reduce"]
    if not ok:
        raise NotMeasured(f"no all-reduce was timed ({skip_reason(rows)})")
    gradient = summary.get("course_gradient_bytes")
    if not gradient:
        raise NotMeasured("the summary does not give the course CNN's gradient size")
    n = min(r["processes"] for r in ok)
    key = ("backend", "device", "placement")
    clauses: list[str | Phrase]
    clauses, reduce = [], {}
    for setup in dict.fromkeys(tuple(r[k] for k in key) for r in rows):
        mine = [r for r in rows if tuple(r[k] for k in key) == setup and r["processes"] == n]
        if not mine:  # swept at other numbers of processes only
            continue
        timed = sorted(
            (r for r in mine if r["status"] == OK and r["op"] == "all_reduce"),
            key=lambda r: r["size_bytes"],
        )
        name = _setup(*setup)
        if not timed:
            bad = [r for r in mine if r["op"] in ("all_reduce", "all")] or mine
            clauses.append(name + " " + not_measured(skip_reason(bad)))
            continue
        reduce[setup] = {r["size_bytes"]: r["latency_us"] for r in timed}
        small, large = timed[0], timed[-1]
        clauses.append(
            f"{name} {fmt_num(small['latency_us'])} µs at {fmt_size(small['size_bytes'])} and "
            f"{fmt_num(large['busbw_gb_s'])} GB/s at {fmt_size(large['size_bytes'])}"
        )
    model = summary.get("gradient_model")
    of = (
        f": {model['parameters']:,} parameters, built for {data_name(model['dataset'])}"
        if (model)
        else ""
    )
    facts = {
        "processes": str(n),
        "setups": join("; ", clauses),
        "gradient": fmt_size(gradient) + of,
    }
    nccl = reduce.get(("nccl", "cuda", "host"))
    if nccl is None:
        mine = [r for r in rows if r["backend"] == "nccl" and r["processes"] == n]
        why = skip_reason(mine) if mine else "the config sweeps no NCCL setup"
        return "no_nccl", facts | {"why": not_measured(why)}
    gloo = {d: reduce.get(("gloo", d, "host")) for d in ("cuda", "cpu")}
    common = set(nccl).intersection(*(g for g in gloo.values() if g)) or set(nccl)
    size = min(common, key=lambda s: (abs(math.log(s / gradient)), s))
    facts["size"] = fmt_size(size)
    for device, latencies in gloo.items():
        if not latencies or size not in latencies:
            mine = [
                r
                for r in rows
                if (r["backend"], r["device"], r["placement"]) == ("gloo", device, "host")
                and r["processes"] == n
            ]
            why = skip_reason(mine) if not latencies else f"it did not time {fmt_size(size)}"
            facts[f"gloo_{device}"] = not_measured(why)
            continue
        ratio = nccl[size] / latencies[size]
        facts[f"gloo_{device}"] = (
            f"{fmt_num(ratio)}× ({fmt_num(latencies[size])} vs {fmt_num(nccl[size])} µs, the "
            "medians of the timed calls; the sweep keeps no spread, so no verdict)"
        )
    return "compared", facts


def _setup(backend: str, device: str, placement: str) -> str:
    return (
        f"{BACKENDS.get(backend, backend)} on {TENSORS.get(device, device)}"
        f"{PLACEMENTS.get(placement, f' ({placement})')}"
    )


def notes(summary: dict[str, Any]) -> list[str]:
    """Per setup that timed an all-reduce: its latency at the smallest size (the fixed cost of
    a call), its best bus bandwidth, and all-reducing the course CNN's gradient once,
    interpolated between the measured sizes (none where the gradient lies outside them)."""
    gradient = summary.get("course_gradient_bytes")
    key = ("backend", "device", "processes", "placement")
    reduce = [r for r in summary["rows"] if r["status"] == OK and r["op"] == "all_reduce"]
    said = []
    for setup in dict.fromkeys(tuple(r[k] for k in key) for r in reduce):
        mine = [r for r in reduce if tuple(r[k] for k in key) == setup]
        peak = max(mine, key=lambda r: r["busbw_gb_s"])
        smallest = min(mine, key=lambda r: r["size_bytes"])
        backend, device, processes, placement = setup
        text = (
            f"{_setup(backend, device, placement)}, {processes} processes: all-reduce latency "
            f"{fmt_num(smallest['latency_us'])} µs at {fmt_size(smallest['size_bytes'])} (the "
            f"fixed cost of a call), bus bandwidth up to {fmt_num(peak['busbw_gb_s'])} GB/s (at "
            f"{fmt_size(peak['size_bytes'])})"
        )
        if gradient and (at := latency_at(mine, gradient, extrapolate=False)) is not None:
            text += (
                f"; all-reducing the course CNN's {fmt_size(gradient)} gradient once takes "
                f"about {fmt_num(at / 1000)} ms (interpolated between the measured sizes)"
            )
        said.append(text + ".")
    return said


SPEC = StudySpec(
    name="collectives",
    cases=("compared", "no_nccl"),
    facts=facts,
    tables=(
        Table(
            (
                "Latency (median of the timed calls) and bandwidth (nccl-tests' algbw and busbw) "
                "per backend, tensor device, collective and message size"
            ),
            "collectives.csv",
        ),
    ),
    repeats=(("iterations", "timed calls per size at most"),),
    notes=notes,
)
