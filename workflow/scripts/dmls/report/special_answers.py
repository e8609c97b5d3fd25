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

import csv
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from dmls import stats
from dmls.report.answers import TOO_WIDE_RATIO, NotMeasured
from dmls.report.wording import minus

OK = "ok"
# Two byte counts (or bytes per parameter) agree when they differ by at most this fraction.
AGREE = 0.01
# D2: misses of the Monte Carlo intervals are put down to chance while the binomial chance of
# at least as many (at the intervals' confidence) is at least this.
CHANCE = 0.05
# D4: what each strategy label of sharding.csv ran (workflow/scripts/dmls/training/parallel.py).
SHARDING = {
    "none": "DDP (DistributedDataParallel)",
    "optimizer": "ZeroRedundancyOptimizer under DDP (ZeRO-1)",
    "gradients": (
        "fully_shard on every layer with reshard_after_forward=False (FSDP's ZeRO-2: it "
        "shards the parameters at rest too)"
    ),
    "full": "fully_shard on every layer with reshard_after_forward=True (ZeRO-3)",
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


# --------------------------------------------------------------------------- helpers
def not_measured(why: str) -> str:
    """A placeholder's text for a part this folder lacks."""
    return f"not measured here, as {why}"


def _rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary's rows; NotMeasured when the study produced none, or skipped all of them."""
    rows = summary.get("rows") or []
    if not rows:
        raise NotMeasured("the study wrote no results")
    if not any(r.get("status") == OK for r in rows):
        raise NotMeasured(_reason(rows))
    return rows


def _reason(rows: list[dict[str, Any]]) -> str:
    """Why a part did not run, from the first of `rows` that is not ok: "it was skipped: no
    CUDA device on this host", "it failed: ..."."""
    bad = next((r for r in rows if r.get("status") != OK), None)
    if bad is None:
        return "the config does not measure it"
    return f"it {_was(bad.get('status'))}: {bad.get('reason') or 'no reason was given'}"


def _was(status: Any, plural: bool = False) -> str:
    """A row's status as a verb: 'failed', 'was skipped' ('were skipped')."""
    return "failed" if status == "failed" else f"{'were' if plural else 'was'} {status}"


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _count(n: float) -> str:
    return f"{n:,.0f}"


def _bytes(n: float) -> str:
    """'1,487,328 bytes (1.42 MiB)'."""
    return f"{n:,.0f} bytes ({_size(n)})"


def _size(n: float) -> str:
    """A message size in binary units, three significant digits: '4 B', '2.37 MiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _percent(fraction: float, decimals: int = 1) -> str:
    return f"{100 * fraction:.{decimals}f}%"


def _sig(x: float, digits: int = 4) -> str:
    return minus(f"{x:.{digits}g}")


def _num(x: float) -> str:
    """Three significant digits, in positional notation: '0.247', '68.7', '1,600'."""
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return minus(np.format_float_positional(x, precision=3, unique=False, fractional=False,
                                            trim="-"))  # fmt: skip


def _mean(row: dict[str, Any], mean: str, ci95: str) -> str:
    """A row's mean with the half-width of its 95% interval where it has one: '3.17 ± 0.278'."""
    half = row.get(ci95)
    if half is None or half == "" or not math.isfinite(float(half)):
        return _num(float(row[mean]))
    return f"{_num(float(row[mean]))} ± {_num(float(half))}"


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}" if str(n) == "1" else f"{n} {word}s"


def _closeness(measured: float, reference: float) -> str:
    """'agrees' within AGREE, else 'X% above' / 'X% below' (relative to `reference`)."""
    off = measured / reference - 1
    if abs(off) <= AGREE:
        return "agrees"
    return f"{_percent(abs(off))} {'above' if off > 0 else 'below'}"


def speed(reference: list[float], other: list[float], means: str) -> str:
    """`other` against `reference` as a speed, the reference's time over the other's (the ratio
    of their geometric means), with its 95% interval over the repeats where both have two or
    more, the two means (`means`, as written) and a verdict:
    '0.82× (95% interval 0.75–0.89×; 3.17 ± 0.278 vs 2.59 ± 0.137 ms), slower'."""
    r = stats.ratio(reference, other)
    if r is None:
        raise NotMeasured("no time was recorded")
    if r.has_interval:
        inside = f"95% interval {r.low:.2f}–{r.high:.2f}×; {means}"
        if r.high / max(r.low, 1e-12) > TOO_WIDE_RATIO:
            verdict = "too few repeats to tell (the interval is too wide)"
        else:
            verdict = "within noise" if r.within_noise else _faster(r.value)
    else:
        inside = f"{means}; one repeat, no interval"
        verdict = _faster(r.value)
    return f"{r.value:.2f}× ({inside}), {verdict}"


def _faster(ratio: float) -> str:
    return "faster" if ratio > 1 else "slower" if ratio < 1 else "the same"


# --------------------------------------------------------------------------- D1
def lenet_memory(summary: dict[str, Any], folder: Path) -> Facts:
    """D1: the parameter count against the closed form; AdamW fp32 without recomputation,
    estimated and measured (on the GPU where it ran, else on the CPU, saying why); and what
    full recomputation saves in the estimate. Cases: "full", or "no_full" where the config
    estimates no full recomputation."""
    rows = _rows(summary)
    params = summary.get("parameters") or {}
    if "model_total" not in params or "closed_form_total" not in params:
        raise NotMeasured("the study did not count the parameters")
    model, closed = params["model_total"], params["closed_form_total"]
    agreement = "agree" if model == closed else f"disagree, by {_count(abs(model - closed))}"
    estimates = {
        (e["optimizer"], e["precision"], e["recompute"]): e for e in summary.get("estimate") or []
    }
    base = estimates.get(BASELINE)
    if base is None:
        raise NotMeasured("the config estimates no AdamW fp32 training without recomputation")
    wanted = [r for r in rows if (r["optimizer"], r["precision"], r["recompute"]) == BASELINE]
    measured = {r["device"]: r for r in wanted if r["status"] == OK}
    if not measured:
        raise NotMeasured(_reason(wanted))
    device = "cuda" if "cuda" in measured else next(iter(measured))
    row = measured[device]
    peak, estimate = row["peak_bytes"], base["total_bytes"]
    facts = {
        "parameters": _count(model),
        "closed_form": _count(closed),
        "agreement": agreement,
        "estimate": _bytes(estimate),
        "device": DEVICES.get(device, device)
        + _elsewhere([r for r in wanted if r["device"] != device]),
        "peak": _bytes(peak),
        "ratio": f"{peak / estimate:.2f}×",
        "verdict": "under" if estimate < peak else "over",
        "gap": _percent(abs(peak - estimate) / peak),
    }
    full = estimates.get((*BASELINE[:2], "full"))
    if full is None:
        return "no_full", facts | {"why": "the config estimates no full recomputation"}
    saved = estimate - full["total_bytes"]
    return "full", facts | {
        "effect": "saves" if saved >= 0 else "adds",
        "saved": f"{_count(abs(saved))} bytes ({_percent(abs(saved) / estimate)} of the estimate)",
        "full_estimate": _bytes(full["total_bytes"]),
        "kept_none": _bytes(base["activations_stored_bytes"]),
        "kept_full": _bytes(full["activations_stored_bytes"]),
        "working": _bytes(full["recompute_working_bytes"]),
    }


def _elsewhere(others: list[dict[str, Any]], what: str = "") -> str:
    """Why the rows of another device (or `what`) are missing, where they are: " (the GPU's
    rows were skipped: no CUDA device on this host)"; empty where none is missing."""
    bad = next((r for r in others if r.get("status") != OK), None)
    if bad is None:
        return ""
    what = what or f"{DEVICES.get(bad['device'], bad['device'])}'s rows"
    return f" ({what} {_was(bad['status'], plural=True)}: {bad.get('reason')})"


# --------------------------------------------------------------------------- D2
def spare_failure(summary: dict[str, Any], folder: Path) -> Facts:
    """D2: the first vector's failure probabilities without and with a spare and the spare's
    reduction, closed form with the Monte Carlo estimate and interval; and whether every
    closed form (the vectors' and the curve's, curve.csv) lies in its Monte Carlo interval,
    checked from the numbers (not the within_ci flag). Cases: "all_within"; "within_chance"
    where some lie outside but no more than chance explains (CHANCE); "outside" where more do."""
    rows = [r for r in _rows(summary) if r["status"] == OK]
    name = rows[0]["vector"]
    mine = {r["quantity"]: r for r in rows if r["vector"] == name}
    if not {"no_spare", "with_spare", "reduction"} <= set(mine):
        raise NotMeasured(f"the rows of {name} are incomplete")
    checked = rows + _read_csv(folder / "curve.csv")
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
            f"{_sig(r['closed_form'])} (Monte Carlo {_sig(r['monte_carlo'])}, "
            f"{100 * confidence:g}% interval {_sig(r['ci_low'])}–{_sig(r['ci_high'])})"
        )

    no_spare, reduction = mine["no_spare"]["closed_form"], mine["reduction"]["closed_form"]
    facts = {
        "vector": f"{name} ({mine['no_spare']['n']} machines, p = "
        f"{', '.join(str(mine['no_spare']['p']).split())})",
        "no_spare": probability(mine["no_spare"]),
        "with_spare": probability(mine["with_spare"]),
        "reduction": probability(mine["reduction"]),
        "share": _percent(reduction / no_spare) if no_spare else "none",
        "total": str(total),
        "expected": _num(total * miss),
        "confidence": f"{100 * confidence:g}%",
    }
    if outside:
        facts |= {"outside": str(outside), "chance": _sig(tail, 2)}
    return case, facts


# --------------------------------------------------------------------------- D3
def float32_bytes(summary: dict[str, Any], folder: Path) -> Facts:
    """D3: the value's bits by field, its bytes in both orders, and the round trip. Cases:
    "exact" (both byte orders give back the stored float32), "inexact"."""
    rows = _rows(summary)
    r = rows[0]
    if r["status"] != OK:
        raise NotMeasured(_reason(rows))
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
        "error": _sig(r["relative_rounding_error"], 3),
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
    rows = _rows(summary)
    facts: dict[str, str] = {}
    for device in DEVICES:
        mine = {r["mode"]: r for r in rows if r["device"] == device}
        facts[f"steady_{device}"], facts[f"first_{device}"] = _graph_device(device, mine)
    control = summary.get("control_flow") or _read_csv(folder / "control_flow.csv")
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
        why = not_measured(_reason([eager]) if eager else "eager did not run")
        return why, why
    steady, first = [], []
    for mode, name in MODES.items():
        row = modes.get(mode)
        if row is None:
            continue
        if row["status"] != OK:
            steady.append(f"{name} {not_measured(_reason([row]))}")
            continue
        means = (
            f"{_mean(row, 'steady_step_ms', 'steady_step_ms_ci95')} vs "
            f"{_mean(eager, 'steady_step_ms', 'steady_step_ms_ci95')} ms"
        )
        steady.append(f"{name} {speed(_repeats(eager), _repeats(row), means)}")
        calls = 1000 * float(row["first_call_s"]) / float(eager["steady_step_ms"])
        first.append(f"{name} {_num(float(row['first_call_s']))} s, {_count(calls)} eager steps")
    nothing = not_measured("no captured mode ran")
    return "; ".join(steady) or nothing, "; ".join(first) or nothing


def _repeats(row: dict[str, Any]) -> list[float]:
    """A mode's steady step per repeat (summary.json); its mean alone where only the CSV's is
    known."""
    return [float(x) for x in row.get("repeats") or [row["steady_step_ms"]]]


def _branch(row: dict[str, Any]) -> str:
    outcome = row["outcome"]
    if outcome == "graph break":
        graphs, breaks = _plural(row["graphs"], "graph"), _plural(row["graph_breaks"], "break")
        return f"broke it into {graphs} at {breaks}, running the branch in Python between them"
    if outcome == "refused":
        error = str(row.get("detail") or "").split(":")[0].strip()
        return f"refused it ({error})" if error else "refused it"
    if outcome == "exported":
        return f"exported it as {_plural(row['graphs'], 'graph')}"
    return str(outcome)


# --------------------------------------------------------------------------- A5 explained
def collectives(summary: dict[str, Any], folder: Path) -> Facts:
    """A5 explained, at the fewest processes that ran: each setup's all-reduce latency at the
    smallest message and bus bandwidth at the largest; and Gloo against NCCL (a speed: NCCL's
    time over Gloo's) at the sweep's size nearest the course CNN's gradient (on a log scale).
    Cases: "compared", or "no_nccl" where NCCL did not run."""
    rows = _rows(summary)
    ok = [r for r in rows if r["status"] == OK and r["op"] == "all_reduce"]
    if not ok:
        raise NotMeasured(f"no all-reduce was timed ({_reason(rows)})")
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
            clauses.append(f"{name} {not_measured(_reason(bad))}")
            continue
        reduce[setup] = {r["size_bytes"]: r["latency_us"] for r in timed}
        small, large = timed[0], timed[-1]
        clauses.append(
            f"{name} {_num(small['latency_us'])} µs at {_size(small['size_bytes'])} and "
            f"{_num(large['busbw_gb_s'])} GB/s at {_size(large['size_bytes'])}"
        )
    facts = {"processes": str(n), "setups": "; ".join(clauses), "gradient": _size(gradient)}
    nccl = reduce.get(("nccl", "cuda", "host"))
    if nccl is None:
        mine = [r for r in rows if r["backend"] == "nccl" and r["processes"] == n]
        why = _reason(mine) if mine else "the config sweeps no NCCL setup"
        return "no_nccl", facts | {"why": why}
    gloo = {d: reduce.get(("gloo", d, "host")) for d in ("cuda", "cpu")}
    common = set(nccl).intersection(*(g for g in gloo.values() if g)) or set(nccl)
    size = min(common, key=lambda s: (abs(math.log(s / gradient)), s))
    facts["size"] = _size(size)
    for device, latencies in gloo.items():
        if not latencies or size not in latencies:
            mine = [r for r in rows if (r["backend"], r["device"], r["placement"])
                    == ("gloo", device, "host") and r["processes"] == n]  # fmt: skip
            why = _reason(mine) if not latencies else f"it did not time {_size(size)}"
            facts[f"gloo_{device}"] = not_measured(why)
            continue
        ratio = nccl[size] / latencies[size]
        facts[f"gloo_{device}"] = (
            f"{_num(ratio)}× ({_num(latencies[size])} vs {_num(nccl[size])} µs, the medians of "
            f"the timed calls), {_faster(ratio)}"
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
    rows = _rows(summary)
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
            ran.append(f"{name} {not_measured(_reason([r]))}")
            continue
        ran.append(f"{name} as strategy {strategy}")
        p = r["parameters"]
        measured = r["state_bytes"] / p
        closed = r["state_closed_form_bytes"] / p
        text = f"{r['stage']} {measured:.2f} against {closed:.2f}, {_closeness(measured, closed)}"
        expected = r.get("state_expected_bytes")
        if expected and _closeness(expected / p, closed) != "agrees":
            text += (
                f" (the split the implementation makes gives {expected / p:.2f}: "
                f"{_closeness(measured, expected / p)})"
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
    means = (
        f"{_mean(other, 'step_ms', 'step_ms_ci95')} vs {_mean(ddp, 'step_ms', 'step_ms_ci95')} ms"
    )
    facts["step"] = f"{other['stage']} {speed(_steps(ddp), _steps(other), means)}"
    return "measured", facts


def _parameters(p: int) -> str:
    return f"{p / 1e6:,.1f} M" if p >= 1e6 else _count(p)


def _steps(row: dict[str, Any]) -> list[float]:
    """A strategy's step time per timed epoch (summary.json); its mean alone without them."""
    return [float(x) for x in row.get("step_ms_samples") or [row["step_ms"]]]


# --------------------------------------------------------------------------- B4
def profiler(summary: dict[str, Any], folder: Path) -> Facts:
    """Which module kind of the B model costs the most time and memory, against the next one,
    and which activation is the slowest, against the fastest: ratios of the geometric means
    over the profiler's repeats (the study's `verdicts`), on the CPU where it ran (the course
    profiled the CPU), else the GPU."""
    _rows(summary)  # (raises, with the reason, where every row was skipped)
    if not (summary.get("verdicts") or {}).get("by_device"):
        raise NotMeasured("the profiler wrote no verdicts")
    by_device = summary["verdicts"]["by_device"]
    device = "cpu" if "cpu" in by_device else next(iter(by_device))
    v = by_device[device]
    unit = {"cpu_time_ms": "ms", "device_time_ms": "ms", "cpu_memory_kib": "KiB",
            "device_memory_kib": "KiB"}  # fmt: skip

    def costlier(block: dict[str, Any], first: str, second: str) -> str:
        means = block["means"]
        u = unit.get(block["metric"], "")
        both = f"{_sig(means[block[first]], 3)} vs {_sig(means[block[second]], 3)} {u}"
        if block.get("value") is None:
            return f"{block[first]} ({both})"
        ratio = stats.Comparison(
            block["value"], block.get("low"), block.get("high"), block.get("n", 1),
            block.get("n", 1), 1.0,
        )  # fmt: skip
        if not ratio.has_interval:
            inside, verdict = f"{both}; one repeat, no interval", "more"
        else:
            inside = f"95% interval {ratio.low:.2f}–{ratio.high:.2f}×; {both}"
            if ratio.high / max(ratio.low, 1e-12) > TOO_WIDE_RATIO:
                verdict = "too few repeats to tell"
            else:
                verdict = "within noise" if ratio.within_noise else "more"
        return f"{block[first]}, {ratio.value:.2f}× {block[second]}'s ({inside}), {verdict}"

    return "measured", {
        "device": DEVICES.get(device, device),
        "activation": v.get("activation", "relu"),
        "time": costlier(v["time"], "costliest", "second"),
        "memory": costlier(v["memory"], "costliest", "second"),
        "activations": costlier(v["activations"], "slowest", "fastest"),
        "repeats": str(summary["verdicts"].get("repeats", "")),
    }


# --------------------------------------------------------------------------- C
def fused_conv(summary: dict[str, Any], folder: Path) -> Facts:
    """The fused kernel against cuDNN per network depth, forward and backward, as cuDNN's time
    over the fused kernel's with its interval over the repeats (repeats.csv), and each mode's
    test accuracy in percent with its interval."""
    rows = _rows(summary)
    if not rows or not (folder / "repeats.csv").exists():
        raise NotMeasured(_reason(rows) or "the study did not run")
    repeats = _read_csv(folder / "repeats.csv")
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
            return not_measured(_reason(skipped) or "cuDNN or the fused kernel did not run")
        means = (f"{stats.geometric_mean(cudnn) * 1e3:.1f} vs "
                 f"{stats.geometric_mean(fused) * 1e3:.1f} ms")  # fmt: skip
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
    return sentences


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
