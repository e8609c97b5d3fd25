"""The declaration of D1 (LeNet-5's memory, estimated and measured, by
measure.py beside it): the facts its answer is filled from and what its report section
shows (dmls/study_spec.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dmls.report.comparisons import NotMeasured
from dmls.report.special_answers import elsewhere, finished_rows, not_measured, skip_reason
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
        return "no_full", facts | {
            "why": not_measured("the config estimates no full recomputation")
        }
    saved = estimate - full["total_bytes"]
    facts["measured_full"] = _recompute_measured(rows, summary)
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


def _recompute_measured(rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """What recomputation did to the measured peak, every cell: for AdamW fp32 on each device,
    selective's and full's change against none (bytes and %); over every optimizer and
    precision measured, in how many cells each lowered the peak, left it or raised it; and
    the GPU libraries' workspaces, allocated before the measurement and outside it."""
    peaks = {
        (r["device"], r["optimizer"], r["precision"], r["recompute"]): r["peak_bytes"]
        for r in rows
        if r["status"] == OK
    }
    devices = sorted({key[0] for key in peaks}, key=lambda d: d != "cuda")
    per_device = []
    for device in devices:
        none = peaks.get((device, *BASELINE))
        said = [
            f"{mode} {_change(peaks[(device, *BASELINE[:2], mode)], none)}"
            for mode in ("selective", "full")
            if none and (device, *BASELINE[:2], mode) in peaks
        ]
        if said:
            per_device.append(f"on {DEVICES.get(device, device)} {', '.join(said)}")
    if not per_device:
        return "no recomputation was measured against none"
    counts = []
    for mode in ("selective", "full"):
        changes = [
            peak - peaks[(d, o, p, "none")]
            for (d, o, p, r), peak in peaks.items()
            if r == mode and (d, o, p, "none") in peaks
        ]
        if not changes:
            continue
        lower, same = sum(c < 0 for c in changes), sum(c == 0 for c in changes)
        counts.append(
            f"{mode} lowered it in {lower}, left it in {same} and raised it in "
            f"{len(changes) - lower - same} of {len(changes)}"
        )
    text = (
        f"measured against none for AdamW fp32, {'; '.join(per_device)}; over every optimizer, "
        f"precision and device, {'; '.join(counts)}"
    )
    if workspace := summary.get("cuda_library_workspace_bytes"):
        text += (
            f" (on the GPU, {fmt_bytes(workspace)} of the CUDA libraries' workspaces were "
            "allocated before the measured window and are in none of these peaks)"
        )
    return text


def _change(peak: int, reference: int) -> str:
    """'−201,728 bytes (−10.3%)', the peak against `reference`."""
    return minus(f"{peak - reference:+,} bytes ({peak / reference - 1:+.1%})")


# D1's method, under its tables: what the estimate and the measurement count (said of how the
# study measures, never of what it found).
METHOD = (
    "What autograd keeps for the backward is not 'every layer's output': a convolution's "
    "backward needs its input, tanh, sigmoid and ReLU keep their output, average pooling reads "
    "its input (the activation's output, one tensor, counted once) and flatten is a view. The "
    "estimate's activations are what each policy keeps by that rule; the note below gives what "
    "was measured against it.",
    "Mixed precision (autocast with GradScaler) keeps fp32 weights and fp32 gradients and casts "
    "fp16 copies of the weights in each forward (autocast's cast cache), so the measurement "
    "counts those copies among the activations, where the estimate counts a persistent fp16 "
    "copy, an fp32 master and fp16 gradients.",
    "'other_bytes' is what the peak holds beyond weights, gradients, optimizer state and "
    "activations: workspaces (the CPU convolution's unfolded input, cuDNN's), the optimizer's "
    "temporaries, gradients in flight and the allocator's rounding may each be part of it; "
    "this study does not measure it buffer by buffer.",
    "Optimizer state exists only after the first step, and gradients are freed after each "
    "(zero_grad(set_to_none=True)): the peak is over several steps, the parts are read at the "
    "last.",
    "CPU memory is the profiler's bytes allocated minus freed inside the measured window, "
    "which starts before the model is built; GPU memory is torch.cuda.max_memory_allocated "
    "over the same window (not the CUDA context, not cached free blocks). Workspaces CUDA "
    "libraries keep for the whole process (cuBLAS's, one per thread that runs a GEMM) are "
    "allocated by an unmeasured warm-up of every precision and policy and given once, as "
    "cuda_library_workspace_bytes.",
)


def notes(summary: dict[str, Any]) -> list[str]:
    """The method (METHOD), then per device the activations each recomputation policy kept,
    measured, against the estimate's (the first optimizer and precision measured there),
    whichever way each went."""
    estimates = {
        (e["optimizer"], e["precision"], e["recompute"]): e for e in summary.get("estimate") or []
    }
    said = list(METHOD)
    ok = [r for r in summary["rows"] if r["status"] == OK]
    for device in dict.fromkeys(r["device"] for r in ok):
        mine = [r for r in ok if r["device"] == device]
        first = (mine[0]["optimizer"], mine[0]["precision"])
        parts = []
        for r in mine:
            estimate = estimates.get((*first, r["recompute"]))
            if (r["optimizer"], r["precision"]) != first or not estimate:
                continue
            kept = estimate["activations_stored_bytes"]
            parts.append(
                f"{r['recompute']} {r['activations_bytes']:,} vs {kept:,} bytes "
                f"({r['activations_bytes'] / kept:.2f}×)"
            )
        if parts:
            said.append(
                f"Activations kept on {DEVICES.get(device, device)} ({first[0]}, {first[1]}), "
                f"measured vs estimated: {'; '.join(parts)}."
            )
    return said


SPEC = StudySpec(
    name="lenet_memory",
    cases=("full", "no_full"),
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
    notes=notes,
)
