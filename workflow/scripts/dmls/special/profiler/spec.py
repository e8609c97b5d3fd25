"""The declaration of B4 (the profiler study, measured by measure.py beside it): the facts its
answer is filled from and what its report section shows (dmls/study_spec.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dmls import stats
from dmls.report.comparisons import NotMeasured, Ratio
from dmls.report.phrases import Phrase, figure
from dmls.report.special_answers import (
    finished_rows,
)
from dmls.report.wording import DEVICES, fmt_sig, minus, ratio_strings
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
    ) -> str | Phrase:
        means = block["means"]
        u = unit.get(block["metric"], "")
        both = f"{fmt_sig(means[block[first]], 3)} vs {fmt_sig(means[block[second]], 3)} {u}"
        if block.get("value") is None:
            return f"{block[first]} ({both})"
        phrase = Ratio.of(_stored(block), both, "repeat")
        verdict = phrase.judge(word, less)
        head, tail = f"{block[first]}, {phrase.value} {block[second]}'s (", f"), {verdict}"
        return figure(head + phrase.inside + tail, head + phrase.inside_brief + tail)

    if "time_per_layer" not in v:  # (a summary written before the turns and the control)
        raise NotMeasured("this B4 summary predates its per-module figures and its control")
    block = v["activations"]
    return "measured", {
        "device": DEVICES.get(device, device),
        "activation": v.get("activation", "relu"),
        "time": costlier(v["time"], "costliest", "second"),
        "memory": costlier(v["memory"], "costliest", "second"),
        "time_per_layer": costlier(v["time_per_layer"], "costliest", "second"),
        "modules": _modules(v["time_per_layer"]["modules"]),
        "activations": costlier(block, "slowest", "fastest", "slower", "faster"),
        "ranking": _ranking(block, unit.get(block["metric"], "")),
        "vs_batchnorm": "; ".join(
            f"{name} {_ratio(r, 'repeat', 'slower', 'faster')}"
            for name, r in sorted(block["vs_batchnorm"].items(), key=lambda i: i[1]["value"])
        ),
        "control": "; ".join(
            f"{name}'s {_ratio(r, 'repeat', 'slower', 'faster')}"
            for name, r in block["control"].items()
            if name not in ("kind", "reference")
        ),
        "drift": _drift(v.get("drift")),
        "repeats": str(summary["verdicts"].get("repeats", "")),
    }


def _ratio(r: dict[str, Any], unit: str, more: str, less: str) -> str:
    """A stored ratio (value, low, high) as the answers write one, with its verdict."""
    if r.get("value") is None:
        return "not measured"
    result = _stored(r)
    value, interval = ratio_strings(result)
    verdict = stats.verdict(result, more, less, unit)
    return f"{value} ({interval}), {verdict}" if interval else f"{value}, {verdict}"


def _stored(r: dict[str, Any]) -> stats.Comparison:
    """A ratio as the study stored it (value, low, high; `n` repeats) read back as numbers."""
    n = r.get("n") or (2 if r.get("low") is not None else 1)
    return stats.Comparison(r["value"], r.get("low"), r.get("high"), n, n, 1.0)


def _modules(modules: dict[str, int]) -> str:
    """'2 Linear, 1 BatchNorm, 1 Activation'."""
    return ", ".join(f"{n} {kind}" for kind, n in modules.items())


def _drift(drift: dict[str, Any] | None) -> str:
    """How the control's time moved from the study's first pass to its last, as a share of
    its mean, with its interval (a line through every pass)."""
    if not drift or drift.get("low") is None:
        return "not measured (fewer than three passes)"
    way = stats.finding(
        stats.Comparison(
            drift["over_study"], drift["low"], drift["high"], drift["passes"], drift["passes"], 0.0
        )
    )
    said = {stats.MORE: "it slowed", stats.LESS: "it sped up"}.get(way, "within its noise")
    return minus(
        f"{100 * drift['over_study']:+.1f}% ({100 * drift['low']:+.1f} to "
        f"{100 * drift['high']:+.1f}%) over the study's {drift['seconds']:.0f} s, {said}"
    )


def _ranking(block: dict[str, Any], unit: str) -> str:
    """Every activation with its mean over the repeats, fastest first: "ReLU 1.2 ms, Tanh ...";
    the course asks for each of them."""
    means = block["means"]
    return ", ".join(
        f"{name} {fmt_sig(means[name], 3)} {unit}".rstrip() for name in sorted(means, key=means.get)
    )


SPEC = StudySpec(
    name="profiler",
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
