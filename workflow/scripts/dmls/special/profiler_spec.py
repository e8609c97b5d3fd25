"""The declaration of B4 (the profiler study, measured by dmls/special/profiler.py): the facts its
answer is filled from and what its report section shows (dmls/study_spec.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dmls import stats
from dmls.report.comparisons import NotMeasured, Ratio
from dmls.report.special_answers import (
    finished_rows,
)
from dmls.report.wording import DEVICES, fmt_sig
from dmls.study_spec import Facts, StudySpec, Table


def facts(summary: dict[str, Any], folder: Path) -> Facts:
    """Which module kind of the B model costs the most time and memory, against the next one,
    and which activation is the slowest, against the fastest: ratios of the geometric means
    over the profiler's repeats (the study's `verdicts`), on the CPU where it ran (the course
    profiled the CPU), else the GPU."""
    finished_rows(summary)  # (raises, with the reason, where every row was skipped)
    if not (summary.get("verdicts") or {}).get("by_device"):
        raise NotMeasured("the profiler wrote no verdicts")
    by_device = summary["verdicts"]["by_device"]
    device = "cpu" if "cpu" in by_device else next(iter(by_device))
    v = by_device[device]
    unit = {"cpu_time_ms": "ms", "device_time_ms": "ms", "cpu_memory_kib": "KiB",
            "device_memory_kib": "KiB"}  # fmt: skip

    def costlier(
        block: dict[str, Any],
        first: str,
        second: str,
        word: str = "costlier",
        less: str = "cheaper",
    ) -> str:
        means = block["means"]
        u = unit.get(block["metric"], "")
        both = f"{fmt_sig(means[block[first]], 3)} vs {fmt_sig(means[block[second]], 3)} {u}"
        if block.get("value") is None:
            return f"{block[first]} ({both})"
        ratio = stats.Comparison(
            block["value"], block.get("low"), block.get("high"), block.get("n", 1),
            block.get("n", 1), 1.0,
        )  # fmt: skip
        phrase = Ratio.of(ratio, both, "repeat")
        verdict = phrase.judge(word, less)
        return f"{block[first]}, {phrase.value} {block[second]}'s ({phrase.inside}), {verdict}"

    return "measured", {
        "device": DEVICES.get(device, device),
        "activation": v.get("activation", "relu"),
        "time": costlier(v["time"], "costliest", "second"),
        "memory": costlier(v["memory"], "costliest", "second"),
        "activations": costlier(v["activations"], "slowest", "fastest", "slower", "faster"),
        "ranking": _ranking(v["activations"], unit.get(v["activations"]["metric"], "")),
        "repeats": str(summary["verdicts"].get("repeats", "")),
    }


def _ranking(block: dict[str, Any], unit: str) -> str:
    """Every activation with its mean over the repeats, fastest first: "ReLU 1.2 ms, Tanh ...";
    the course asks for each of them."""
    means = block["means"]
    return ", ".join(f"{name} {fmt_sig(means[name], 3)} {unit}".rstrip()
                     for name in sorted(means, key=means.get))  # fmt: skip


SPEC = StudySpec(
    name="profiler",
    entry="dmls.special.profiler:run",
    facts=facts,
    tables=(
        Table(
            (
                "Time (ms) and memory (KiB) per module kind, summed over the profiled test "
                "batches: mean over the repeats and, in the _ci95 columns, the half-width of its "
                "95% interval"
            ),
            "modules.csv",
            (
                "device",
                "activation",
                "kind",
                "modules",
                "calls",
                "repeats",
                "cpu_time_ms_mean",
                "cpu_time_ms_ci95",
                "cpu_self_time_ms_mean",
                "cpu_self_time_ms_ci95",
                "cpu_memory_kib_mean",
                "cpu_memory_kib_ci95",
                "device_time_ms_mean",
                "device_time_ms_ci95",
                "device_memory_kib_mean",
                "device_memory_kib_ci95",
            ),
        ),
    ),
    downloads="traces/*.json.gz",
)
