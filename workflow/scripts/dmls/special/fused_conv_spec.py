"""The declaration of C (the fused conv + ReLU kernel against cuDNN, measured by
dmls/special/fused_conv.py): the facts its answer is filled from and what its report section
shows (dmls/study_spec.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dmls import stats
from dmls.report.comparisons import NotMeasured
from dmls.report.special_answers import (
    finished_rows,
    not_measured,
    read_csv_rows,
    skip_reason,
    speed,
)
from dmls.report.study import OK
from dmls.study_spec import Facts, StudySpec, Table


def facts(summary: dict[str, Any], folder: Path) -> Facts:
    """The fused kernel against cuDNN per network depth, forward and backward, as cuDNN's time
    over the fused kernel's with its interval over the repeats (repeats.csv), and each mode's
    test accuracy in percent with its interval."""
    rows = finished_rows(summary)
    if not rows or not (folder / "repeats.csv").exists():
        raise NotMeasured(skip_reason(rows) or "the study did not run")
    repeats = read_csv_rows(folder / "repeats.csv")
    depths = sorted({int(r["depth"]) for r in rows})

    def times(depth: int, mode: str, part: str) -> list[float]:
        return [
            float(r[f"{part}_time_s"])
            for r in repeats
            if int(r["depth"]) == depth
            and r["mode"] == mode
            and r[f"{part}_time_s"] not in ("", None)
        ]

    def part(depth: int, name: str, mode: str = "fused") -> str:
        cudnn, other = times(depth, "cudnn", name), times(depth, mode, name)
        if not cudnn or not other:
            pair = [r for r in rows if int(r["depth"]) == depth and r["mode"] in ("cudnn", mode)]
            skipped = [r for r in pair if r["status"] != OK]
            return not_measured(skip_reason(skipped) or f"cuDNN or {mode} did not run")
        # The other mode's time first, as every "run vs reference" pair is written.
        means = (f"{stats.geometric_mean(other) * 1e3:.1f} vs "
                 f"{stats.geometric_mean(cudnn) * 1e3:.1f} ms")  # fmt: skip
        try:
            return speed(cudnn, other, means)
        except NotMeasured as e:
            return not_measured(str(e))

    def others(depth: int) -> str:
        """The course's two other baselines against cuDNN: cuDNN off, and the CPU (where cuDNN
        itself did not run, why, once)."""
        if not times(depth, "cudnn", "forward"):
            cudnn = [r for r in rows if int(r["depth"]) == depth and r["mode"] == "cudnn"]
            return "cuDNN off and the CPU " + not_measured(
                skip_reason(cudnn) or "cuDNN did not run"
            )
        said = [
            f"{label}: forward {part(depth, 'forward', mode)}, backward "
            f"{part(depth, 'backward', mode)}"
            for mode, label in (("no_cudnn", "with cuDNN off"), ("cpu", "on the CPU"))
            if any(r["mode"] == mode for r in rows)
        ]
        return "; ".join(said) or not_measured("the config runs neither cuDNN off nor the CPU")

    def accuracy(depth: int) -> str:
        parts = []
        for mode in dict.fromkeys(r["mode"] for r in rows):
            values = [
                100 * float(r["test_accuracy"])
                for r in repeats
                if int(r["depth"]) == depth and r["mode"] == mode and r["test_accuracy"]
            ]
            estimate = stats.mean_interval(values)
            if estimate is None:
                continue
            half = "" if estimate.low is None else f" ± {(estimate.high - estimate.low) / 2:.1f}"
            parts.append(f"{mode} {estimate.mean:.1f}%{half}")
        return "; ".join(parts) or not_measured("no mode finished")

    shallow, deep = depths[0], depths[-1]
    return "measured", {
        "shallow": str(shallow),
        "deep": str(deep),
        "forward_shallow": part(shallow, "forward"),
        "backward_shallow": part(shallow, "backward"),
        "forward_deep": part(deep, "forward"),
        "backward_deep": part(deep, "backward"),
        "others_shallow": others(shallow),
        "others_deep": others(deep),
        "accuracy_shallow": accuracy(shallow),
        "accuracy_deep": accuracy(deep),
    }


SPEC = StudySpec(
    name="fused_conv",
    entry="dmls.special.fused_conv:run",
    facts=facts,
    tables=(
        Table(
            (
                "Forward and backward time (s, summed over a training's steps after the warm-up) "
                "and test accuracy (fraction) per network and mode: mean over the repeats and, in"
                " the _ci95 columns, the half-width of its 95% interval"
            ),
            "results.csv",
            (
                "depth",
                "title",
                "status",
                "reason",
                "device_name",
                "fused_layers",
                "epochs",
                "repeats",
                "forward_time_s",
                "forward_time_s_ci95",
                "backward_time_s",
                "backward_time_s_ci95",
                "test_accuracy",
                "test_accuracy_ci95",
            ),
        ),
    ),
)
