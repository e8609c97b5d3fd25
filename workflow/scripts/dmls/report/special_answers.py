"""The special studies' answers to their questions: at most three sentences each, every figure
taken from the study's results/studies/<name>/ files (summary.json and its CSVs).

As for the training studies (dmls.report.answers), the words are templates in
report/studies.yaml, under a special section's `answer:`; each entry names the facts it is
filled from and has a template per case, or one for all:

    answer:
      - facts: spare_failure
        topic: failure with and without a spare
        say: "For {vector}, the job fails with probability {no_spare} without a spare ..."

A facts function reads one study's summary (and its folder, for the CSVs the summary does not
hold): `(summary, folder) -> (case, facts)`, the facts already written as text, or it raises
NotMeasured with the reason when the study did not produce what the answer needs (a failed or
skipped study, the rows the answer reads skipped on this host). A part that is missing while
the rest stands is written into its placeholder as "not measured here, as <why>", as
answers.py does for a comparison. Ratios of times follow one convention: the reference's time
over the other's (a speed), so > 1 means faster.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scipy import stats as scipy_stats

from dmls import stats
from dmls.report.answers import (
    NotMeasured,
    Ratio,
    faster_word,
    finished_rows,
    not_measured,
    read_csv_rows,
    said_once,
    skip_reason,
    speed,
    status_verb,
)
from dmls.report.wording import (
    closeness,
    fmt_bytes,
    fmt_count,
    fmt_mean,
    fmt_num,
    fmt_percent,
    fmt_plural,
    fmt_sig,
    fmt_size,
    minus,
)

OK = "ok"
# D2: misses of the Monte Carlo intervals are put down to chance while the binomial chance of
# at least as many (at the intervals' confidence) is at least this.
CHANCE = 0.05
# D4: what each strategy label of sharding.csv ran (workflow/scripts/dmls/training/parallel.py).
SHARDING = {
    "none": "DDP (DistributedDataParallel)",
    "optimizer": "ZeroRedundancyOptimizer under DDP (ZeRO-1)",
    "gradients": "fully_shard, reshard_after_forward=False (ZeRO-2-like; parameters sharded too)",
    "full": "fully_shard, reshard_after_forward=True (ZeRO-3)",
}
# From the least to the most sharded.
SHARDING_ORDER = ("none", "optimizer", "gradients", "full")
# A5 explained: how the sweep's setups are named in a sentence.
BACKENDS = {"nccl": "NCCL", "gloo": "Gloo"}
TENSORS = {"cuda": "CUDA tensors", "cpu": "CPU tensors"}
PLACEMENTS = {"host": "", "nodes": " over two emulated nodes", "slurm": " over two Slurm nodes"}
DEVICES = {"cuda": "the GPU", "cpu": "the CPU"}
MODES = {"compile": "compiled", "export": "exported"}

# D1: the combination the answer reads, (optimizer, precision, recompute).
BASELINE = ("adamw", "fp32", "none")

Facts = tuple[str, dict[str, str]]


# --------------------------------------------------------------------------- D1
def lenet_memory(summary: dict[str, Any], folder: Path) -> Facts:
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
        + _elsewhere([r for r in wanted if r["device"] != device]),
        "peak": fmt_bytes(peak),
        "ratio": f"{peak / estimate:.2f}×",
        "verdict": "under" if estimate < peak else "over",
        "gap": fmt_percent(abs(peak - estimate) / peak),
    }
    full = estimates.get((*BASELINE[:2], "full"))
    if full is None:
        return "no_full", facts | {"why": "the config estimates no full recomputation"}
    saved = estimate - full["total_bytes"]
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


def _elsewhere(others: list[dict[str, Any]], what: str = "") -> str:
    """Why the rows of another device (or `what`) are missing, where they are: " (the GPU's
    rows were skipped: no CUDA device on this host)"; empty where none is missing."""
    bad = next((r for r in others if r.get("status") != OK), None)
    if bad is None:
        return ""
    what = what or f"{DEVICES.get(bad['device'], bad['device'])}'s rows"
    return f" ({what} {status_verb(bad['status'], plural=True)}: {bad.get('reason')})"


# --------------------------------------------------------------------------- D2
def spare_failure(summary: dict[str, Any], folder: Path) -> Facts:
    """D2: the first vector's failure probabilities without and with a spare and the spare's
    reduction, closed form with the Monte Carlo estimate and interval; and whether every
    closed form (the vectors' and the curve's, curve.csv) lies in its Monte Carlo interval,
    checked from the numbers (not the within_ci flag). Cases: "all_within"; "within_chance"
    where some lie outside but no more than chance explains (CHANCE); "outside" where more do."""
    rows = [r for r in finished_rows(summary) if r["status"] == OK]
    name = rows[0]["vector"]
    mine = {r["quantity"]: r for r in rows if r["vector"] == name}
    if not {"no_spare", "with_spare", "reduction"} <= set(mine):
        raise NotMeasured(f"the rows of {name} are incomplete")
    checked = rows + read_csv_rows(folder / "curve.csv")
    confidence = float(rows[0]["confidence"])
    total = len(checked)
    outside = sum(
        not (float(r["ci_low"]) <= float(r["closed_form"]) <= float(r["ci_high"])) for r in checked
    )
    miss = 1 - confidence
    # The chance of at least `outside` misses among `total` intervals that each miss with
    # probability 1 - confidence.
    tail = float(scipy_stats.binom.sf(outside - 1, total, miss)) if outside else 1.0
    case = "all_within" if not outside else "within_chance" if tail >= CHANCE else "outside"

    def probability(r: dict[str, Any]) -> str:
        return (
            f"{fmt_sig(r['closed_form'])} (Monte Carlo {fmt_sig(r['monte_carlo'])}, "
            f"{100 * confidence:g}% interval {fmt_sig(r['ci_low'])}–{fmt_sig(r['ci_high'])})"
        )

    no_spare, reduction = mine["no_spare"]["closed_form"], mine["reduction"]["closed_form"]
    facts = {
        "vector": f"{name} ({mine['no_spare']['n']} machines, p = "
        f"{', '.join(str(mine['no_spare']['p']).split())})",
        "no_spare": probability(mine["no_spare"]),
        "with_spare": probability(mine["with_spare"]),
        "reduction": probability(mine["reduction"]),
        "share": fmt_percent(reduction / no_spare) if no_spare else "none",
        "total": str(total),
        "expected": fmt_num(total * miss),
        "confidence": f"{100 * confidence:g}%",
    }
    if outside:
        facts |= {"outside": str(outside), "chance": fmt_sig(tail, 2)}
    return case, facts


# --------------------------------------------------------------------------- D3
def float32_bytes(summary: dict[str, Any], folder: Path) -> Facts:
    """D3: the value's bits by field, its bytes in both orders, and the round trip. Cases:
    "exact" (both byte orders give back the stored float32), "inexact"."""
    rows = finished_rows(summary)
    r = rows[0]
    if r["status"] != OK:
        raise NotMeasured(skip_reason(rows))
    sign, exponent, fraction = r["bits_binary"].split()
    facts = {
        "value": repr(r["value"]),
        "bits_hex": r["bits_hex"],
        "sign": f"{sign} ({'negative' if r['sign'] else 'positive'})",
        "exponent": minus(f"{exponent} (biased {r['exponent_biased']}, so 2^{r['exponent']})"),
        "fraction": f"{fraction} ({r['fraction_hex']}, significand {r['significand']!r})",
        "little": r["bytes_little_endian"],
        "big": r["bytes_big_endian"],
        "host": f"{r['host_byte_order']}-endian",
        "stored": repr(r["round_trip_little_endian"]),
        "error": fmt_sig(r["relative_rounding_error"], 3),
    }
    exact = r["round_trip_exact"] in (True, "True") and (
        r["round_trip_little_endian"] == r["round_trip_big_endian"]
    )
    return ("exact" if exact else "inexact"), facts


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
    facts = {"processes": str(n), "setups": "; ".join(clauses), "gradient": fmt_size(gradient)}
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
            f"medians of the timed calls), {faster_word(ratio)}"
        )
    return "compared", facts


def _setup(backend: str, device: str, placement: str) -> str:
    return (
        f"{BACKENDS.get(backend, backend)} on {TENSORS.get(device, device)}"
        f"{PLACEMENTS.get(placement, f' ({placement})')}"
    )


# --------------------------------------------------------------------------- D4
def sharding(summary: dict[str, Any], folder: Path) -> Facts:
    """D4, on the GPUs where they ran (else on the CPU) at the largest N that ran: what ran,
    the state per rank in bytes per parameter against the closed form the study computed for
    that N (and the split the implementation makes, where it differs), and the most sharded
    strategy's step against DDP's (a speed: DDP's time over the strategy's)."""
    rows = finished_rows(summary)
    ok = [r for r in rows if r["status"] == OK]
    device = "cuda" if any(r["device"] == "cuda" for r in ok) else ok[0]["device"]
    n = max(r["processes"] for r in ok if r["device"] == device)
    mine = {r["strategy"]: r for r in rows if (r["device"], r["processes"]) == (device, n)}
    order = [s for s in SHARDING_ORDER if s in mine] + [s for s in mine if s not in SHARDING]
    ran, memory = [], []
    for strategy in order:
        r = mine[strategy]
        name = SHARDING.get(strategy, strategy)
        if r["status"] != OK:
            ran.append(f"{name} {not_measured(skip_reason([r]))}")
            continue
        ran.append(name)
        p = r["parameters"]
        measured = r["state_bytes"] / p
        closed = r["state_closed_form_bytes"] / p
        text = f"{r['stage']} {measured:.2f} against {closed:.2f}, {closeness(measured, closed)}"
        expected = r.get("state_expected_bytes")
        if expected and closeness(expected / p, closed) != "agrees":
            text += (
                f" (the split the implementation makes gives {expected / p:.2f}: "
                f"{closeness(measured, expected / p)})"
            )
        memory.append(text)
    done = {s: r for s, r in mine.items() if r["status"] == OK}
    where = f"{n} {DEVICES.get(device, device).removeprefix('the ')} ranks"
    more = [r for r in rows if r["device"] == device and r["processes"] > n]
    facts = {
        "ranks": where
        + _elsewhere([r for r in rows if r["device"] != device])
        + _elsewhere(
            more, f"{DEVICES.get(device, device).removeprefix('the ')} rows of more ranks"
        ),
        "parameters": _parameters(next(iter(done.values()))["parameters"]),
        "ran": "; ".join(ran),
        "memory": "; ".join(memory),
    }
    sharded = next((s for s in reversed(SHARDING_ORDER) if s in done and s != "none"), None)
    if "none" not in done or sharded is None:
        missing = "DDP did not run" if "none" not in done else "no sharded strategy ran"
        facts["step"] = not_measured(f"{missing} on {where}")
        return "measured", facts
    ddp, other = done["none"], done[sharded]
    step_means = (fmt_mean(row, "step_ms", "step_ms_ci95") for row in (other, ddp))
    means = " vs ".join(step_means) + " ms"
    facts["step"] = f"{other['stage']} {speed(_steps(ddp), _steps(other), means)}"
    return "measured", facts


def _parameters(p: int) -> str:
    return f"{p / 1e6:,.1f} M" if p >= 1e6 else fmt_count(p)


def _steps(row: dict[str, Any]) -> list[float]:
    """A strategy's step time per timed epoch (summary.json); its mean alone without them."""
    return [float(x) for x in row.get("step_ms_samples") or [row["step_ms"]]]


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
        phrase = Ratio.of(ratio, both, "one repeat, no interval", "repeat")
        verdict = phrase.judge(word, less)
        return f"{block[first]}, {phrase.value} {block[second]}'s ({phrase.inside}), {verdict}"

    return "measured", {
        "device": DEVICES.get(device, device),
        "activation": v.get("activation", "relu"),
        "time": costlier(v["time"], "costliest", "second"),
        "memory": costlier(v["memory"], "costliest", "second"),
        "activations": costlier(v["activations"], "slowest", "fastest", "slower", "faster"),
        "repeats": str(summary["verdicts"].get("repeats", "")),
    }


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

    def part(depth: int, name: str) -> str:
        cudnn, fused = times(depth, "cudnn", name), times(depth, "fused", name)
        if not cudnn or not fused:
            pair = [r for r in rows if int(r["depth"]) == depth and r["mode"] in ("cudnn", "fused")]
            skipped = [r for r in pair if r["status"] != OK]
            return not_measured(skip_reason(skipped) or "cuDNN or the fused kernel did not run")
        # The fused kernel's time first, as every "run vs reference" pair is written.
        means = (f"{stats.geometric_mean(fused) * 1e3:.1f} vs "
                 f"{stats.geometric_mean(cudnn) * 1e3:.1f} ms")  # fmt: skip
        try:
            return speed(cudnn, fused, means)
        except NotMeasured as e:
            return not_measured(str(e))

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
        "accuracy_shallow": accuracy(shallow),
        "accuracy_deep": accuracy(deep),
    }


# --------------------------------------------------------------------------- D6
def spark_lazy(summary: dict[str, Any], folder: Path) -> Facts:
    """D6: which lines of question 4's program started jobs, in which order the chains ran,
    what count() and the collect() after it ran without and with cache(), and what the
    optimizer folded (summary rows: lines.csv)."""
    rows = finished_rows(summary)
    if any(r["status"] != OK for r in rows):
        raise NotMeasured(skip_reason(rows))
    plain, cached = (
        [r for r in rows if r["variant"] == variant] for variant in ("no cache", "cache")
    )
    if not plain or not cached:
        raise NotMeasured("the study recorded no line of one of its variants")
    actions = [r for r in plain if int(r["jobs"])]
    idle = [r for r in plain if not int(r["jobs"])]
    defines = [r for r in idle if "createDataFrame" in r["code"]]
    count = next(r for r in plain if r["code"].endswith(".count()"))
    collect = next(r for r in plain if r["code"].endswith("renamed_df_2nd.collect()"))
    cached_count = next(r for r in cached if r["code"].endswith(".count()"))
    cached_collect = next(r for r in cached if r["code"].endswith("renamed_df_2nd.collect()"))
    rules = summary.get("convert_to_local_relation") or {}
    folded = (rules.get("no cache") or {}).get("effective_runs")
    control = summary.get("control") or {}
    facts = {
        "idle": fmt_plural(len(idle), "line"),
        "defines": (
            "createDataFrame of a Python list included"
            if defines and len(defines) == sum("createDataFrame" in r["code"] for r in plain)
            else "createDataFrame started a job"
        ),
        "actions": "; ".join(f"{_call(r)}: {fmt_plural(int(r['jobs']), 'job')}" for r in actions),
        "order": ", then ".join(dict.fromkeys(_chain(r) for r in actions if _chain(r))),
        "count": fmt_plural(int(count["jobs"]), "job"),
        "count_stages": _stages(count),
        "optimized": _optimized(summary, "renamed_df_2nd"),
        "again": _scanned(collect),
        "cached_count": fmt_plural(int(cached_count["jobs"]), "job"),
        "cached_again": _scanned(cached_collect),
        "folded": (
            not_measured("the study recorded no rule counts")
            if folded is None
            else f"ConvertToLocalRelation folded nothing ({folded} effective runs)"
            if not folded
            else f"ConvertToLocalRelation folded the chain {fmt_plural(folded, 'time')}"
        ),
        "control": (
            fmt_plural(int(control["jobs"]), "job")
            if control.get("status") == OK
            else not_measured("the control failed")
        ),
    }
    return "measured", facts


def _call(row: dict[str, Any]) -> str:
    """'renamed_df_2nd.count()' of 'row_count_2nd = renamed_df_2nd.count()'."""
    return row["code"].split("=", 1)[-1].strip()


def _chain(row: dict[str, Any]) -> str:
    return _call(row).split(".", 1)[0]


def _stages(row: dict[str, Any]) -> str:
    """A line's jobs and their stages, without task counts: 'job 0: stage 0 ran; job 1: stage 1
    skipped, stage 2 ran'."""
    text = re.sub(r"stage (\d+) ran \d+ task\(s\)", r"stage \1 ran", str(row["job_stages"]))
    return re.sub(r" \(\d+ task\(s\)\)", "", text)


def _scanned(row: dict[str, Any]) -> str:
    """Whether a line ran its chain from the source again, from what its scans read:
    'ran the chain again from its source: 1 job (...), Scan ExistingRDD read 3 rows'."""
    read = {}
    for item in str(row.get("rows_scanned") or "").split("; "):
        if "=" in item:
            name, count = item.rsplit("=", 1)
            read[name] = int(count)
    source = sum(n for name, n in read.items() if not name.startswith("InMemory"))
    cache = sum(n for name, n in read.items() if name.startswith("InMemory"))
    verdict = (
        "ran the chain again from its source" if source
        else "read the cached rows, not the source" if cache
        else "read nothing"
    )  # fmt: skip
    said = ", ".join(f"{name} read {fmt_plural(n, 'row')}" for name, n in read.items())
    return f"{verdict} ({fmt_plural(int(row['jobs']), 'job')}{': ' + said if said else ''})"


def _optimized(summary: dict[str, Any], chain: str) -> str:
    """The optimized logical plan of `chain` (no cache) as one line, operator over operator,
    without Spark's expression ids: 'Project [...] over Filter (...) over LogicalRDD [...]'."""
    plan = ((summary.get("plans") or {}).get("no cache") or {}).get(chain)
    if not plan or "== Optimized Logical Plan ==" not in plan:
        return not_measured(f"the study recorded no optimized plan of {chain}")
    section = plan.split("== Optimized Logical Plan ==", 1)[1].split("==", 1)[0]
    nodes = [
        re.sub(r"#\d+L?|, false$", "", line.lstrip(" +-:").strip())
        for line in section.strip().splitlines()
    ]
    return " over ".join(n for n in nodes if n)


# --------------------------------------------------------------------------- D7
def serialization(summary: dict[str, Any], folder: Path) -> Facts:
    """D7: one value's bytes per format, what each format refuses or changes, shared references
    and cycles, the deepest nesting written and read, and torch.load's refusal of a pickle that
    runs code. Parts that failed are "not measured here" in their own placeholders."""
    rows = finished_rows(summary)
    failed = {r["part"]: r for r in rows if r["status"] != OK}

    def part(name: str) -> list[dict[str, Any]]:
        if name in failed:
            raise NotMeasured(skip_reason([failed[name]]))
        return summary.get(name) or read_csv_rows(folder / f"{name}.csv")

    facts: dict[str, str] = {}
    for name, keys, fill in (
        (
            "representation",
            ("value", "fixed", "pickle", "json", "misread", "lost"),
            _representation,
        ),
        ("references", ("shared", "cycle"), _references),
        ("depth", ("depth",), lambda rows: _depth(rows, (summary.get("host") or {}).get("python"))),
        ("trust", ("state_dict", "hostile"), _trust),
    ):
        try:
            facts |= fill(part(name))
        except NotMeasured as e:
            facts |= dict.fromkeys(keys, not_measured(str(e)))
    return "measured", facts


def _representation(rows: list[dict[str, Any]]) -> dict[str, str]:
    first = rows[0]["value"]
    by_format: dict[str, dict[str, Any]] = {}  # the first value's first row of each format
    for r in rows:
        if r["value"] == first:
            by_format.setdefault(r["format"], r)
    fixed = {int(r["bytes"]) for r in rows if r["value"] == first and r["format"] in (
        "struct", "numpy")}  # fmt: skip
    lost = []
    for value in dict.fromkeys(r["value"] for r in rows):
        of_value = [r for r in rows if r["value"] == value]
        refused = [r for r in of_value if r["round_trip"] == "refused"]
        changed = [r for r in of_value if r["round_trip"] == "changed"]
        said = []
        if refused:
            formats = " and ".join(dict.fromkeys(r["format"] for r in refused))
            said.append(f"is refused by {formats} ({refused[0]['error'].split(':')[0]})")
        said += [f"comes back as {r['read_back']} ({r['format']})" for r in changed]
        if said:
            lost.append(f"{value} {' and '.join(said)}")
    return {
        "value": first,
        "fixed": " and ".join(f"{b:,}" for b in sorted(fixed)),
        "pickle": fmt_count(int(by_format["pickle"]["bytes"])),
        "json": fmt_count(int(by_format["JSON"]["bytes"])),
        "misread": fmt_sig(float(by_format["struct"]["other_order_reads"]), 3),
        "lost": "; ".join(lost) or "every value came back exact from every format",
    }


def _references(rows: list[dict[str, Any]]) -> dict[str, str]:
    def said(r: dict[str, Any]) -> str:
        if r["round_trip"] == "refused":
            return f"{r['format']} refused it ({r['error']})"
        return f"{r['format']} {r['round_trip']} ({fmt_count(int(r['bytes']))} bytes)"

    return {
        case: ", ".join(said(r) for r in rows if r["case"] == case) for case in ("shared", "cycle")
    }


def _depth(rows: list[dict[str, Any]], python: str | None) -> dict[str, str]:
    def said(r: dict[str, Any]) -> str:
        deepest, tried = int(r["deepest"]), int(r["tried_up_to"])
        levels = f"at least {fmt_count(deepest)}" if deepest >= tried else fmt_count(deepest)
        return f"{r['format']} {r['phase']} {levels}"

    limit = rows[0]["recursion_limit"]
    version = tuple(int(p) for p in (python or "0.0").split(".")[:2])
    # From Python 3.12 the recursion limit bounds Python frames only; C code, as pickle's and
    # json's C writers and readers, has a depth guard of its own (What's New in Python 3.12).
    bound = (
        ", which bounds Python frames only, not C code such as these" if version >= (3, 12) else ""
    )
    where = (
        f"Python {python}, recursion limit {limit}{bound}"
        if python
        else (f"Python's recursion limit {limit}")
    )
    return {"depth": f"{', '.join(said(r) for r in rows)} ({where})"}


def _trust(rows: list[dict[str, Any]]) -> dict[str, str]:
    state = next(r for r in rows if r["case"].startswith("state_dict"))
    hostile = [r for r in rows if not r["case"].startswith("state_dict")]

    def said(r: dict[str, Any]) -> str:
        ran = r["code_ran"] in (True, "True")
        if r["result"] == "refused":
            return f"{r['loader']} refused it ({r['error']}){'' if not ran else ', yet it ran'}"
        return f"{r['loader']} {'ran it' if ran else 'loaded it without running it'}"

    return {
        "state_dict": f"{state['loader']} gave it back as {state['result']}",
        "hostile": "; ".join(said(r) for r in hostile),
    }


# --------------------------------------------------------------------------- answers
# Facts an `answer:` entry of a special section names with `facts:`.
SPECIAL_FACTS: dict[str, Callable[[dict[str, Any], Path], Facts]] = {
    "profiler": profiler,
    "fused_conv": fused_conv,
    "lenet_memory": lenet_memory,
    "spare_failure": spare_failure,
    "float32_bytes": float32_bytes,
    "graphs": graphs,
    "collectives": collectives,
    "sharding": sharding,
    "serialization": serialization,
    "spark_lazy": spark_lazy,
}


def special_answer(entry: Any, summary: dict[str, Any], folder: Path) -> list[str]:
    """The sentences of a special section's `answer:` filled from its study's summary and
    folder. `entry` is the section (its `answer` list is filled), the list itself, or one
    entry. An entry names its facts (`facts:`), has a template per case (`say: {case: ...}`)
    or one for all (`say: "..."`), and an optional `topic`; where its facts are not measured,
    it says so: "Topic: not measured here, as <why>." A sentence equal to the one before it
    (several entries of a study that was not measured) is said once."""
    if isinstance(entry, dict) and "answer" in entry:
        entries = entry["answer"] or []
    elif isinstance(entry, dict):
        entries = [entry]
    else:
        entries = list(entry or [])
    summary = summary or {}  # (a study that did not run)
    computed: dict[str, Facts | NotMeasured] = {}
    sentences: list[str] = []
    for e in entries:
        text = _sentence(e, summary, Path(folder), computed)
        if not sentences or sentences[-1] != text:
            sentences.append(text)
    return said_once(sentences)


def _sentence(
    entry: dict[str, Any],
    summary: dict[str, Any],
    folder: Path,
    computed: dict[str, Facts | NotMeasured],
) -> str:
    name = entry["facts"]
    if name not in computed:
        try:
            computed[name] = SPECIAL_FACTS[name](summary, folder)
        except NotMeasured as e:
            computed[name] = e
    result = computed[name]
    if isinstance(result, NotMeasured):
        topic = entry.get("topic", name)
        return f"{topic[:1].upper()}{topic[1:]}: not measured here, as {result}."
    case, facts = result
    say = entry["say"]
    if isinstance(say, dict):
        if case not in say:
            raise KeyError(f"the answer of {name} has no template for case {case!r}")
        say = say[case]
    return say.format(**facts)
