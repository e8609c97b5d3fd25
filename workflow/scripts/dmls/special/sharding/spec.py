"""The declaration of D4 (sharding's memory and time, measured by measure.py beside it): the
facts its answer is filled from and what its report section shows (dmls/study_spec.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dmls.report.phrases import Phrase, join
from dmls.report.special_answers import elsewhere, finished_rows, not_measured, skip_reason, speed
from dmls.report.study import OK
from dmls.report.wording import (
    DEVICES,
    closeness,
    fmt_count,
    fmt_mean,
    fmt_size,
)
from dmls.study_spec import Facts, StudySpec, Table

# D4: what each strategy label of sharding.csv ran (workflow/scripts/dmls/training/parallel.py).
SHARDING = {
    "none": "DDP (DistributedDataParallel)",
    "optimizer": "ZeroRedundancyOptimizer under DDP (ZeRO-1)",
    "gradients": "fully_shard, reshard_after_forward=False (ZeRO-2-like; parameters sharded too)",
    "full": "fully_shard, reshard_after_forward=True (ZeRO-3)",
}


# From the least to the most sharded.
SHARDING_ORDER = ("none", "optimizer", "gradients", "full")


def facts(summary: dict[str, Any], folder: Path) -> Facts:
    """D4, on the GPUs where they ran (else on the CPU) at the largest N that ran: what ran,
    the state per rank in bytes per parameter against the closed form the study computed for
    that N (and the split the implementation makes, where it differs), and the most sharded
    strategy's step against DDP's (a speed: DDP's time over the strategy's)."""
    rows = finished_rows(summary)
    ok = [r for r in rows if r["status"] == OK]
    device = "cuda" if any(r["device"] == "cuda" for r in ok) else ok[0]["device"]
    n = max(r["processes"] for r in ok if r["device"] == device)
    mine = {r["strategy"]: r for r in rows if (r["device"], r["processes"]) == (device, n)}
    order: list[str]
    order = [s for s in SHARDING_ORDER if s in mine] + [s for s in mine if s not in SHARDING]
    ran: list[str | Phrase]
    ran, memory = [], []
    for strategy in order:
        r = mine[strategy]
        name = SHARDING.get(strategy, strategy)
        if r["status"] != OK:
            ran.append(name + " " + not_measured(skip_reason([r])))
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
        if r.get("peak_allocated_bytes"):  # the course's memory: the peak per rank
            text += f", its peak {_gib(r['peak_allocated_bytes'])}"
            if r.get("peak_predicted_bytes"):
                text += f" (predicted {_gib(r['peak_predicted_bytes'])})"
        memory.append(text)
    done = {s: r for s, r in mine.items() if r["status"] == OK}
    where = f"{n} {DEVICES.get(device, device).removeprefix('the ')} ranks"
    more = [r for r in rows if r["device"] == device and r["processes"] > n]
    facts = {
        "ranks": where
        + elsewhere([r for r in rows if r["device"] != device])
        + elsewhere(more, f"{DEVICES.get(device, device).removeprefix('the ')} rows of more ranks"),
        "parameters": _parameters(next(iter(done.values()))["parameters"]),
        "ns": _rank_counts(rows, device, n) + _not_run(summary),
        "ran": join("; ", ran),
        "memory": "; ".join(memory),
    }
    sharded = next((s for s in reversed(SHARDING_ORDER) if s in done and s != "none"), None)
    if "none" not in done or sharded is None:
        missing = "DDP did not run" if "none" not in done else "no sharded strategy ran"
        facts["step"] = not_measured(f"{missing} on {where}")
        return "measured", facts
    ddp = done["none"]
    steps = []
    for strategy in order:
        if strategy == "none" or strategy not in done:
            continue
        other = done[strategy]
        step_means = (fmt_mean(row, "step_ms", "step_ms_ci95") for row in (other, ddp))
        means = " vs ".join(step_means) + " ms"
        steps.append(other["stage"] + " " + speed(_steps(ddp), _steps(other), means))
    facts["step"] = join("; ", steps)
    return "measured", facts


# The numbers of ranks the course asks D4 for.
COURSE_RANKS = (2, 4)


def _not_run(summary: dict[str, Any]) -> str:
    """Where the config left out a number of ranks the course asks for, that it did."""
    asked = (summary.get("config") or {}).get("processes")
    left = [n for n in COURSE_RANKS if asked is not None and n not in asked]
    if not left:
        return ""
    return (
        f" (N = {' and '.join(map(str, left))} not run: this config's "
        f"special_studies.sharding.processes is {asked})"
    )


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


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


def _memory_note(r: dict[str, Any]) -> str:
    text = (
        f"{r['stage']} {fmt_size(r['state_bytes'])} of state on the largest rank "
        f"({r['state_bytes_per_parameter']:.2f} bytes per parameter; closed form "
        f"{r['state_closed_form_bytes'] / r['parameters']:.2f}, as the implementation splits "
        f"the tensors {r['state_expected_bytes'] / r['parameters']:.2f})"
    )
    if r["peak_allocated_bytes"]:
        text += (
            f", peak {fmt_size(r['peak_allocated_bytes'])} ({r['peak_over_predicted']:.2f}× the "
            "predicted peak)"
        )
    return text


def _step_note(r: dict[str, Any], base: dict[str, Any]) -> str:
    """A strategy's step time beside DDP's, as measured (the answer compares them, as a speed
    with its interval: one convention, computed once, at render time)."""
    text = (
        f"{r['processes']} {r['device']} ranks: a {r['stage']} step takes {r['step_ms']:.3g} "
        f"ms against DDP's {base['step_ms']:.3g} ms"
    )
    if r["comm_predicted_ms"] and base["comm_predicted_ms"]:
        text += (
            f"; the sweep predicts {r['comm_predicted_ms']:.3g} ms of collectives per step "
            f"against DDP's {base['comm_predicted_ms']:.3g} ms"
        )
    return text + "."


def notes(summary: dict[str, Any]) -> list[str]:
    """Per device and number of ranks: each strategy's state and peak on the most loaded rank
    against the closed form and the predicted peak, and its step against DDP's (with the
    collectives' time the A5 sweep predicts, where it ran); ZeRO-3's state from the fewest to
    the next number of ranks against 1/N."""
    notes = []
    ok = [r for r in summary["rows"] if r["status"] == OK]
    swept = any(r.get("comm_predicted_ms") is not None for r in ok)
    for device, n in dict.fromkeys((r["device"], r["processes"]) for r in ok):
        mine = {r["strategy"]: r for r in ok if (r["device"], r["processes"]) == (device, n)}
        first = next(iter(mine.values()))
        notes.append(
            f"{n} {device} ranks, {first['parameters'] / 1e6:.1f} M parameters: "
            + "; ".join(_memory_note(r) for r in mine.values())
            + "."
        )
        if "none" in mine:
            notes += [_step_note(r, mine["none"]) for s, r in mine.items() if s != "none"]
    for device in dict.fromkeys(r["device"] for r in ok):
        full = {r["processes"]: r for r in ok if r["device"] == device and r["strategy"] == "full"}
        if len(full) >= 2:
            (a, ra), (b, rb) = sorted(full.items())[:2]
            notes.append(
                f"ZeRO-3 on {device}: {a} → {b} ranks divides the state per rank by "
                f"{ra['state_bytes'] / rb['state_bytes']:.2f} (1/N predicts {b / a:.2f})."
            )
    if not swept:
        notes.append(
            "No collectives sweep in this results folder for these setups: no communication "
            "time is predicted."
        )
    return notes


SPEC = StudySpec(
    name="sharding",
    facts=facts,
    tables=(
        Table(
            (
                "Memory per rank (the most loaded rank) by strategy and N: parameters, gradients "
                "and Adam state measured from the tensors, against the closed form and the split "
                "the implementation makes; the allocator's peak (GPU) against the predicted one; "
                "step time (mean and 95% interval over the timed epochs) and the collectives' "
                "time the sweep predicts"
            ),
            "sharding.csv",
        ),
    ),
    notes=notes,
)
