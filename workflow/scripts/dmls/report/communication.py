"""A5 explained: how much of a DDP run's steady epoch its gradient all-reduces take, predicted
from the collectives sweep of the same results folder, against the gap measured between runs
that differ only in the backend."""

from __future__ import annotations

import math
from typing import Any, cast

import pandas as pd

from dmls.comm import calls_ms, ddp_buckets, setup_rows
from dmls.report import quantities
from dmls.report.causes import cause
from dmls.report.cells import MIB
from dmls.report.study import Study
from dmls.report.wording import in_s, with_interval


def predictions(study: Study, collectives: pd.DataFrame | None) -> dict[str, dict[str, Any]]:
    """Each finished DDP run's gradient all-reduce per epoch predicted from the collectives
    sweep (DDP's buckets, one all-reduce each per optimizer step, none of it hidden behind the
    backward): per run, `seconds` per epoch, `per_step` ms, `steps` per epoch, the gradient's
    MiB and what was swept; or `why` it can't be predicted."""
    if collectives is None:
        return {}
    swept = collectives.to_dict("records")
    found: dict[str, dict[str, Any]] = {}
    for run in study.ok.index:
        metrics = study.metrics[run]
        spec, params = metrics["spec"], metrics.get("parameters")
        world = metrics["derived"]["processes"]  # (DataParallel: one process, no all-reduce)
        if world < 2:
            continue
        if not params:
            why = "its metrics.json records no parameter count (written by an older version): "
            found[run] = {"why": why + "no communication predicted; rerun it to get one"}
            continue
        device = "cuda" if str(metrics["ranks"][0]["device"]).startswith("cuda") else "cpu"
        backend = spec["backend"]
        per_step = calls_ms(
            setup_rows(swept, backend, device, world),
            [("all_reduce", b) for b in ddp_buckets(4 * params)],
        )
        if per_step is None:
            why = f"the collectives sweep did not time {backend} all-reduces on {device} tensors"
            found[run] = {"why": f"{why} between {world} processes: no prediction"}
            continue
        micro = math.ceil(metrics["data"]["n_train"] / (spec["batch_size"] * world))
        steps = math.ceil(micro / spec["grad_accum_steps"])
        found[run] = {"seconds": steps * per_step / 1000, "per_step": per_step, "steps": steps,
                      "mib": 4 * params / MIB, "backend": backend, "device": device,
                      "world": world}  # fmt: skip
    return found


def communication(study: Study, collectives: pd.DataFrame | None) -> list[str]:
    """A5 explained: each finished DDP run's gradient all-reduce per epoch predicted from the
    collectives sweep (`predictions`), and, for runs that differ only in the backend, that
    prediction of the gap against the measured one."""
    if collectives is None or "backend" not in study.varying:
        return []
    lines = []
    predicted = {}
    for run, p in predictions(study, collectives).items():
        if "why" in p:
            lines.append(f"{run}: {p['why']}.")
            continue
        predicted[run] = p["seconds"]
        steady = study.runs.at[run, "steady_epoch_s"]
        lines.append(
            f"{run}: the collectives sweep puts one all-reduce of its {p['mib']:.3g} MiB "
            f"gradient ({p['backend']}, {p['device']} tensors, {p['world']} processes, in DDP's "
            f"buckets) at {p['per_step']:.3g} ms; its {p['steps']} steps per epoch make "
            f"{in_s(p['seconds'])} of its steady {in_s(steady)} epoch, if none of it overlapped "
            "the backward."
        )
    for a, b in _backend_pairs(study, list(predicted)):
        measured = quantities.compare(study, a, b, "steady_epoch_s")
        if measured is None:
            lines.append(f"{a} vs {b}: not compared, as a side has no steady epoch's time.")
            continue
        # The interval's ends, read only where it has one.
        low, high = cast(float, measured.low), cast(float, measured.high)
        gap = predicted[a] - predicted[b]
        share = ""
        if measured.value > 0 and gap > 0:
            part = gap / measured.value
            share = "; " + cause(
                f"the sweep puts {min(part, 9.99):.0%} of the gap on the all-reduce",
                "the sweep",
                unexplained=1 - part if measured.has_interval and gap < low else None,
            )
        if measured.has_interval and low <= gap <= high:
            share += ", and the prediction lies inside the measured interval"
        elif measured.has_interval and gap > high:
            share += (
                ": more than the gap, as if part of each all-reduce overlapped the backward "
                "(not measured here)"
            )
        # False without an interval, which with_interval then does not read.
        interval: Any = measured.has_interval and f"{in_s(low)} to {in_s(high)}"
        verdict = measured.verdict(f"{a} slower", f"{a} faster")
        lines.append(
            f"{a} vs {b}: their steady epochs differ by "
            f"{with_interval(in_s(measured.value), measured, interval, verdict)}, and the sweep "
            "predicts "
            f"{in_s(gap)} from the all-reduce alone{share}."
        )
    return lines


def _backend_pairs(study: Study, runs: list[str]) -> list[tuple[str, str]]:
    """(slower backend's run, other run) for runs whose specs differ in the backend only."""

    def key(run: str) -> str:
        spec = {k: v for k, v in study.metrics[run]["spec"].items() if k not in ("run", "backend")}
        return repr(sorted(spec.items()))

    pairs = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if key(a) == key(b):
                steady = study.runs.loc[[a, b], "steady_epoch_s"]
                pairs.append((a, b) if steady[a] >= steady[b] else (b, a))
    return pairs
