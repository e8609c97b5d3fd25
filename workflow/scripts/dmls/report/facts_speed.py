"""The speed studies' facts: B4 (the profiler's costliest kinds), C (the fused kernel against
cuDNN), D5 (graphs: compiled and exported) and A5 explained (the collectives' sweep).
(report/special_answers.py says what a facts function gives.)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dmls import stats
from dmls.report.answers import (
    finished_rows,
    not_measured,
    read_csv_rows,
    skip_reason,
    speed,
)
from dmls.report.cells import data_name
from dmls.report.comparisons import Facts, NotMeasured, Ratio
from dmls.report.study import OK
from dmls.report.wording import DEVICES, fmt_count, fmt_mean, fmt_num, fmt_plural, fmt_sig, fmt_size

# A5 explained: how the sweep's setups are named in a sentence.
BACKENDS = {"nccl": "NCCL", "gloo": "Gloo"}
TENSORS = {"cuda": "CUDA tensors", "cpu": "CPU tensors"}
PLACEMENTS = {"host": "", "nodes": " over two emulated nodes", "slurm": " over two Slurm nodes"}

# D5: how a graph mode is named in a sentence.
MODES = {"compile": "compiled", "export": "exported"}


# --------------------------------------------------------------------------- B4
def profiler(summary: dict[str, Any], folder: Path) -> Facts:
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


# --------------------------------------------------------------------------- C
def fused_conv(summary: dict[str, Any], folder: Path) -> Facts:
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


# --------------------------------------------------------------------------- D5
def graphs(summary: dict[str, Any], folder: Path) -> Facts:
    """D5: per device, the steady step of each captured mode against eager's (a speed: eager's
    time over the mode's, with the interval over the repeats), its first call in eager steps,
    and what a branch on a tensor's value did under each capture (control_flow.csv)."""
    rows = finished_rows(summary)
    facts: dict[str, str] = {}
    for device in DEVICES:
        mine = {r["mode"]: r for r in rows if r["device"] == device}
        facts[f"steady_{device}"], facts[f"first_{device}"] = _graph_device(device, mine)
    control = summary.get("control_flow") or read_csv_rows(folder / "control_flow.csv")
    if not control:
        raise NotMeasured("the study recorded no control-flow capture")
    for key, capture, model in (
        ("branch_eager", "eager", "if"), ("branch_compile", "torch.compile", "if"),
        ("branch_export", "torch.export", "if"), ("branch_cond", "torch.export", "torch.cond"),
    ):  # fmt: skip
        row = next(
            (c for c in control if c["capture"] == capture and c["model"].startswith(model)), None
        )
        facts[key] = _branch(row) if row else not_measured(f"the study has no {capture} row")
    return "measured", facts


def _graph_device(device: str, modes: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """The steady-step and first-call clauses of one device."""
    if not modes:
        why = not_measured(f"the config measures nothing on {device}")
        return why, why
    eager = modes.get("eager")
    if eager is None or eager["status"] != OK:
        why = not_measured(skip_reason([eager]) if eager else "eager did not run")
        return why, why
    steady, first = [], []
    for mode, name in MODES.items():
        row = modes.get(mode)
        if row is None:
            continue
        if row["status"] != OK:
            steady.append(f"{name} {not_measured(skip_reason([row]))}")
            continue
        means = (
            f"{fmt_mean(row, 'steady_step_ms', 'steady_step_ms_ci95')} vs "
            f"{fmt_mean(eager, 'steady_step_ms', 'steady_step_ms_ci95')} ms"
        )
        steady.append(f"{name} {speed(_repeats(eager), _repeats(row), means)}")
        calls = 1000 * float(row["first_call_s"]) / float(eager["steady_step_ms"])
        first.append(
            f"{name} {fmt_num(float(row['first_call_s']))} s, {fmt_count(calls)} eager steps"
        )
    nothing = not_measured("no captured mode ran")
    return "; ".join(steady) or nothing, "; ".join(first) or nothing


def _repeats(row: dict[str, Any]) -> list[float]:
    """A mode's steady step per repeat (summary.json); its mean alone where only the CSV's is
    known."""
    return [float(x) for x in row.get("repeats") or [row["steady_step_ms"]]]


def _branch(row: dict[str, Any]) -> str:
    outcome = row["outcome"]
    if outcome == "graph break":
        graphs, breaks = (
            fmt_plural(row["graphs"], "graph"),
            fmt_plural(row["graph_breaks"], "break"),
        )
        return f"broke it into {graphs} at {breaks}, running the branch in Python between them"
    if outcome == "refused":
        error = str(row.get("detail") or "").split(":")[0].strip()
        return f"refused it ({error})" if error else "refused it"
    if outcome == "exported":
        return f"exported it as {fmt_plural(row['graphs'], 'graph')}"
    return str(outcome)


# --------------------------------------------------------------------------- A5 explained
def collectives(summary: dict[str, Any], folder: Path) -> Facts:
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
    clauses, reduce = [], {}
    for setup in dict.fromkeys(tuple(r[k] for k in key) for r in rows):
        mine = [r for r in rows if tuple(r[k] for k in key) == setup and r["processes"] == n]
        if not mine:  # swept at other numbers of processes only
            continue
        timed = sorted((r for r in mine if r["status"] == OK and r["op"] == "all_reduce"),
                       key=lambda r: r["size_bytes"])  # fmt: skip
        name = _setup(*setup)
        if not timed:
            bad = [r for r in mine if r["op"] in ("all_reduce", "all")] or mine
            clauses.append(f"{name} {not_measured(skip_reason(bad))}")
            continue
        reduce[setup] = {r["size_bytes"]: r["latency_us"] for r in timed}
        small, large = timed[0], timed[-1]
        clauses.append(
            f"{name} {fmt_num(small['latency_us'])} µs at {fmt_size(small['size_bytes'])} and "
            f"{fmt_num(large['busbw_gb_s'])} GB/s at {fmt_size(large['size_bytes'])}"
        )
    model = summary.get("gradient_model")
    of = f": {model['parameters']:,} parameters, built for {data_name(model['dataset'])}" if (
        model) else ""  # fmt: skip
    facts = {"processes": str(n), "setups": "; ".join(clauses), "gradient": fmt_size(gradient) + of}
    nccl = reduce.get(("nccl", "cuda", "host"))
    if nccl is None:
        mine = [r for r in rows if r["backend"] == "nccl" and r["processes"] == n]
        why = skip_reason(mine) if mine else "the config sweeps no NCCL setup"
        return "no_nccl", facts | {"why": why}
    gloo = {d: reduce.get(("gloo", d, "host")) for d in ("cuda", "cpu")}
    common = set(nccl).intersection(*(g for g in gloo.values() if g)) or set(nccl)
    size = min(common, key=lambda s: (abs(math.log(s / gradient)), s))
    facts["size"] = fmt_size(size)
    for device, latencies in gloo.items():
        if not latencies or size not in latencies:
            mine = [r for r in rows if (r["backend"], r["device"], r["placement"])
                    == ("gloo", device, "host") and r["processes"] == n]  # fmt: skip
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
