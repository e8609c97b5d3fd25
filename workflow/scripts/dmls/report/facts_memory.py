"""The memory studies' facts: D1 (LeNet-5's memory, estimated and measured), D3 (the bytes
of a float32) and D4 (sharding's memory and time).
(report/special_answers.py says what a facts function gives.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dmls.report.answers import finished_rows, not_measured, skip_reason, speed, status_verb
from dmls.report.comparisons import Facts, NotMeasured
from dmls.report.study import OK
from dmls.report.wording import (
    DEVICES,
    closeness,
    fmt_bytes,
    fmt_count,
    fmt_mean,
    fmt_percent,
    fmt_sig,
    minus,
)

# D1: the combination the answer reads, (optimizer, precision, recompute).
BASELINE = ("adamw", "fp32", "none")

# D4: what each strategy label of sharding.csv ran (workflow/scripts/dmls/training/parallel.py).
SHARDING = {
    "none": "DDP (DistributedDataParallel)",
    "optimizer": "ZeroRedundancyOptimizer under DDP (ZeRO-1)",
    "gradients": "fully_shard, reshard_after_forward=False (ZeRO-2-like; parameters sharded too)",
    "full": "fully_shard, reshard_after_forward=True (ZeRO-3)",
}
# From the least to the most sharded.
SHARDING_ORDER = ("none", "optimizer", "gradients", "full")


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
               "the estimate's saving does not show; this study does not measure why")
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


def _elsewhere(others: list[dict[str, Any]], what: str = "") -> str:
    """Why the rows of another device (or `what`) are missing, where they are: " (the GPU's
    rows were skipped: no CUDA device on this host)"; empty where none is missing."""
    bad = next((r for r in others if r.get("status") != OK), None)
    if bad is None:
        return ""
    what = what or f"{DEVICES.get(bad['device'], bad['device'])}'s rows"
    return f" ({what} {status_verb(bad['status'], plural=True)}: {bad.get('reason')})"


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
        "ns": _rank_counts(rows, device, n),
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


def _rank_counts(rows: list[dict[str, Any]], device: str, n: int) -> str:
    """Which numbers of ranks ran on `device`, and which the figures are of (the course asks
    for 2 and 4): "N = 2 only", "N = 2 and 4; the figures are N = 4's"."""
    ran = sorted({r["processes"] for r in rows if r["device"] == device and r["status"] == OK})
    if len(ran) == 1:
        return f"N = {ran[0]} only"
    return f"N = {', '.join(map(str, ran[:-1]))} and {ran[-1]}; the figures are N = {n}'s"


def _parameters(p: int) -> str:
    return f"{p / 1e6:,.1f} M" if p >= 1e6 else fmt_count(p)


def _steps(row: dict[str, Any]) -> list[float]:
    """A strategy's step time per timed epoch (summary.json); its mean alone without them."""
    return [float(x) for x in row.get("step_ms_samples") or [row["step_ms"]]]
