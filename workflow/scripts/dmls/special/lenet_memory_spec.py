"""The declaration of D1 (LeNet-5's memory, estimated and measured, by
dmls/special/lenet_memory.py): the facts its answer is filled from and what its report section
shows (dmls/study_spec.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dmls.report.comparisons import NotMeasured
from dmls.report.special_answers import elsewhere, finished_rows, skip_reason
from dmls.report.study import OK
from dmls.report.wording import (
    DEVICES,
    fmt_bytes,
    fmt_count,
    fmt_percent,
    minus,
)
from dmls.study_spec import Facts, StudySpec, Table

# D1: the combination the answer reads, (optimizer, precision, recompute).
BASELINE = ("adamw", "fp32", "none")


def facts(summary: dict[str, Any], folder: Path) -> Facts:
    """D1: the parameter count against the closed form; AdamW fp32 without recomputation,
    estimated and measured (on the GPU where it ran, else on the CPU, saying why); and what
    full recomputation saves in the estimate. Cases: "full", or "no_full" where the config
    estimates no full recomputation."""
    rows = finished_rows(summary)
    params = summary.get("parameters") or {}
    if "model_total" not in params or "closed_form_total" not in params:
        raise NotMeasured("the study did not count the parameters")
    model, closed = params["model_total"], params["closed_form_total"]
    agreement = "agree" if model == closed else f"disagree, by {fmt_count(abs(model - closed))}"
    estimates = {
        (e["optimizer"], e["precision"], e["recompute"]): e for e in summary.get("estimate") or []
    }
    base = estimates.get(BASELINE)
    if base is None:
        raise NotMeasured("the config estimates no AdamW fp32 training without recomputation")
    wanted = [r for r in rows if (r["optimizer"], r["precision"], r["recompute"]) == BASELINE]
    measured = {r["device"]: r for r in wanted if r["status"] == OK}
    if not measured:
        raise NotMeasured(skip_reason(wanted))
    device = "cuda" if "cuda" in measured else next(iter(measured))
    row = measured[device]
    peak, estimate = row["peak_bytes"], base["total_bytes"]
    facts = {
        "parameters": fmt_count(model),
        "closed_form": fmt_count(closed),
        "agreement": agreement,
        "estimate": fmt_bytes(estimate),
        "device": DEVICES.get(device, device)
        + elsewhere([r for r in wanted if r["device"] != device]),
        "peak": fmt_bytes(peak),
        "ratio": f"{peak / estimate:.2f}×",
        "verdict": "under" if estimate < peak else "over",
        "gap": fmt_percent(abs(peak - estimate) / peak),
    }
    full = estimates.get((*BASELINE[:2], "full"))
    if full is None:
        return "no_full", facts | {"why": "the config estimates no full recomputation"}
    saved = estimate - full["total_bytes"]
    measured_full = next(
        (r for r in rows if (r["optimizer"], r["precision"], r["recompute"], r["device"])
         == (*BASELINE[:2], "full", device) and r["status"] == OK),
        None,
    )  # fmt: skip
    if measured_full is None:
        facts["measured_full"] = (
            f"the peak with full recomputation was not measured on {facts['device']}"
        )
    else:
        change = measured_full["peak_bytes"] / peak - 1
        facts["measured_full"] = (
            f"on {DEVICES.get(device, device)} full recomputation took the measured peak from "
            f"{fmt_bytes(peak)} to {fmt_bytes(measured_full['peak_bytes'])} "
            f"({minus(f'{change:+.1%}')}): "
            + ("the estimate's saving shows" if change < 0 else
               "the estimate's saving does not show " + WHERE_THE_PEAK_IS_SPLIT[device])
        )  # fmt: skip
    return "full", facts | {
        "effect": "saves" if saved >= 0 else "adds",
        "saved": (
            f"{fmt_count(abs(saved))} bytes ({fmt_percent(abs(saved) / estimate)} of the estimate)"
        ),
        "full_estimate": fmt_bytes(full["total_bytes"]),
        "kept_none": fmt_bytes(base["activations_stored_bytes"]),
        "kept_full": fmt_bytes(full["activations_stored_bytes"]),
        "working": fmt_bytes(full["recompute_working_bytes"]),
    }


# Where a reader finds what a peak holds that the estimate leaves out, per device.
WHERE_THE_PEAK_IS_SPLIT = {
    "cuda": "(bench/lenet_recompute_memory.py lists what the GPU's peak holds)",
    "cpu": "(the measured table splits the peak: other_bytes is what the estimate leaves out)",
}


SPEC = StudySpec(
    name="lenet_memory",
    entry="dmls.special.lenet_memory:run",
    facts=facts,
    tables=(
        Table(
            "Parameters per layer: the model against the closed form",
            "parameters.csv",
        ),
        Table(
            "Training-memory estimate (bytes)",
            "estimate.csv",
        ),
        Table(
            "Measured peaks against the estimate (bytes)",
            "measured.csv",
            (
                "device",
                "optimizer",
                "precision",
                "recompute",
                "status",
                "reason",
                "peak_bytes",
                "estimate_total_bytes",
                "difference_bytes",
                "measured_over_estimate",
            ),
        ),
    ),
    repeats=(("steps", "steps"),),
)
