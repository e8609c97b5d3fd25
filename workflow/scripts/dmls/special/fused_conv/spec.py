"""The declaration of C (the fused conv + ReLU kernel against cuDNN, measured by
measure.py beside it): the facts its answer is filled from and what its report section
shows (dmls/study_spec.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmls.report import quantities
from dmls.report.comparisons import NotMeasured, Ratio
from dmls.report.phrases import Phrase, join
from dmls.report.special_answers import (
    finished_rows,
    not_measured,
    skip_reason,
)
from dmls.report.study import OK
from dmls.report.wording import points_text
from dmls.study_spec import Facts, StudySpec, Table


def _timed_only(row: dict[str, Any]) -> bool:
    """Whether a mode was timed only: its accuracy_reason is fused_conv.TIMED_ONLY (not a failed
    accuracy training's reason). Read as text: this module imports no torch."""
    return str(row.get("accuracy_reason") or "").startswith("timed only")


def _count(n: int | None, noun: str) -> str:
    """'1 epoch', '3 seeds'; '? epochs' where the summary lacks the number."""
    return f"{n} {noun}" if n == 1 else f"{'?' if n is None else n} {noun}s"


def _fraction(points: float | None) -> float | None:
    """A difference in points as a fraction (points_text writes fractions in points)."""
    return None if points is None else points / 100


def _ms(value: float) -> str:
    """A time per step in ms with three significant digits, zeros kept: '1.00', '0.504'."""
    digits = max(0, 2 - math.floor(math.log10(abs(value)))) if value else 2
    return f"{value:.{digits}f}"


@dataclass(frozen=True)
class Measured:
    """C's folder as its answer reads it: the summary's rows and its verdicts, the one place
    its comparisons are computed (fused_conv.verdicts, SPEEDUP_CONVENTION)."""

    rows: list[dict[str, Any]]
    verdicts: dict[str, Any]

    def _depth(self, depth: int) -> dict[str, Any]:
        return (self.verdicts.get("by_depth") or {}).get(str(depth)) or {}

    def measured(self, depth: int, mode: str) -> bool:
        """Whether `mode` was timed against cuDNN at `depth`."""
        entry = (self._depth(depth).get("vs_cudnn") or {}).get(mode) or {}
        return "value" in (entry.get("forward") or {})

    def part(self, depth: int, name: str, mode: str = "fused") -> Phrase:
        """`mode` against cuDNN in `name` (forward, backward) as a speed, or why not."""
        entry = ((self._depth(depth).get("vs_cudnn") or {}).get(mode) or {}).get(name) or {}
        if "value" not in entry:
            pair = [
                r for r in self.rows if int(r["depth"]) == depth and r["mode"] in ("cudnn", mode)
            ]
            skipped = [r for r in pair if r["status"] != OK]
            why = skip_reason(skipped) if skipped else entry.get("reason")
            return not_measured(why or f"cuDNN or {mode} did not run")
        ratio = quantities.Comparison(
            entry["value"], entry["low"], entry["high"], entry["n"], entry["n"], 1.0
        )
        # The other mode's time first, as every "run vs reference" pair is written.
        means = f"{_ms(entry['mode_ms'])} vs {_ms(entry['cudnn_ms'])} ms per step"
        return Ratio.of(ratio, means, "repeat").phrase("faster", "slower")

    def others(self, depth: int) -> Phrase:
        """The course's two other baselines against cuDNN: cuDNN off, and the CPU (where cuDNN
        itself did not run, why, once)."""
        if not any(
            r["status"] == OK
            for r in self.rows
            if int(r["depth"]) == depth and r["mode"] == "cudnn"
        ):
            cudnn = [r for r in self.rows if int(r["depth"]) == depth and r["mode"] == "cudnn"]
            return "cuDNN off and the CPU " + not_measured(
                skip_reason(cudnn) or "cuDNN did not run"
            )
        said = [
            f"{label}: forward "
            + self.part(depth, "forward", mode)
            + ", backward "
            + self.part(depth, "backward", mode)
            for mode, label in (("no_cudnn", "with cuDNN off"), ("cpu", "on the CPU"))
            if any(r["mode"] == mode for r in self.rows)
        ]
        if not said:
            return not_measured("the config runs neither cuDNN off nor the CPU")
        return join("; ", said)

    def accuracy(self, depth: int) -> str | Phrase:
        """Each accuracy mode's mean over the seeds (± the half-width of its interval), then
        fused − cuDNN in points with its verdict; or why the modes trained for it have none."""
        block = self._depth(depth)
        parts = []
        for mode in dict.fromkeys(r["mode"] for r in self.rows):
            estimate = (block.get("test_accuracy_percent") or {}).get(mode)
            if not estimate:
                continue
            half = (
                "" if estimate["low"] is None else f" ± {estimate['high'] - estimate['mean']:.1f}"
            )
            parts.append(f"{mode} {estimate['mean']:.1f}%{half}")
        if not parts:  # why the modes trained for accuracy (not the timed only) have none
            wanted = [
                r
                for r in self.rows
                if int(r["depth"]) == depth and r["status"] != OK and not _timed_only(r)
            ]
            return not_measured(skip_reason(wanted) or "no accuracy training finished")
        if points := block.get("fused_minus_cudnn_points"):
            difference = quantities.Comparison(
                points["value"] / 100,
                _fraction(points["low"]),
                _fraction(points["high"]),
                points["n_fused"],
                points["n_cudnn"],
                0.0,
            )
            parts.append(f"fused − cuDNN {points_text(difference)}")
        return "; ".join(parts)

    def timed_only(self) -> str:
        """Which modes were timed only (the config's accuracy_modes leave them out)."""
        first = min(int(r["depth"]) for r in self.rows)
        modes = [r["mode"] for r in self.rows if int(r["depth"]) == first and _timed_only(r)]
        if not modes:
            return "every mode was trained for its accuracy"
        which = f"mode {modes[0]} was" if len(modes) == 1 else f"modes {' and '.join(modes)} were"
        return f"the {which} timed only, not trained for accuracy (the config's accuracy_modes)"


def facts(summary: dict[str, Any], folder: Path) -> Facts:
    """The fused kernel against cuDNN per network depth, forward and backward, as cuDNN's time
    per step over the fused kernel's with its interval over the repeats they took turns in;
    each accuracy mode's test accuracy in percent with its interval over the seeds, and fused −
    cuDNN in points by the one verdict rule: all as the summary's verdicts computed them."""
    rows = finished_rows(summary)
    if not rows or not summary.get("verdicts"):
        raise NotMeasured(skip_reason(rows) or "the study did not run")
    c = Measured(rows, summary["verdicts"])
    depths = sorted({int(r["depth"]) for r in rows})
    shallow, deep = depths[0], depths[-1]
    return "measured", {
        "shallow": str(shallow),
        "deep": str(deep),
        "epochs": _count((summary.get("config") or {}).get("epochs"), "epoch"),
        "seeds": _count(summary.get("accuracy_seeds"), "seed"),
        "forward_shallow": c.part(shallow, "forward"),
        "backward_shallow": c.part(shallow, "backward"),
        "forward_deep": c.part(deep, "forward"),
        "backward_deep": c.part(deep, "backward"),
        "others_shallow": c.others(shallow),
        "others_deep": c.others(deep),
        "accuracy_shallow": c.accuracy(shallow),
        "accuracy_deep": c.accuracy(deep),
        "timed_only": c.timed_only(),
    }


SPEC = StudySpec(
    name="fused_conv",
    facts=facts,
    repeats=(
        ("repeats", "speed repeats"),
        ("timed_steps", "timed steps each"),
        ("accuracy_seeds", "accuracy seeds"),
    ),
    tables=(
        Table(
            (
                "Forward and backward time per training step (ms, mean over the repeats of "
                "timed_steps steps after the warm-up) and test accuracy (fraction, mean over "
                "the accuracy seeds' full trainings; empty for a mode timed only, "
                "accuracy_reason says why); the _ci95 columns give the half-width of each "
                "mean's 95% interval"
            ),
            "results.csv",
            (
                "depth",
                "title",
                "status",
                "reason",
                "device_name",
                "fused_layers",
                "repeats",
                "timed_steps",
                "forward_ms",
                "forward_ms_ci95",
                "backward_ms",
                "backward_ms_ci95",
                "accuracy_seeds",
                "epochs",
                "test_accuracy",
                "test_accuracy_ci95",
                "accuracy_reason",
            ),
        ),
    ),
)
