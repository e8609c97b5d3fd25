"""The declaration of D5 (graphs, compiled and exported, measured by measure.py beside it): the
facts its answer is filled from and what its report section shows (dmls/study_spec.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dmls.report.comparisons import NotMeasured
from dmls.report.phrases import Phrase, join
from dmls.report.special_answers import (
    finished_rows,
    not_measured,
    read_csv_rows,
    skip_reason,
    speed,
)
from dmls.report.study import OK
from dmls.report.wording import DEVICES, fmt_count, fmt_mean, fmt_num, fmt_plural
from dmls.study_spec import Facts, StudySpec, Table

# D5: how a graph mode is named in a sentence.
MODES = {"compile": "compiled", "export": "exported"}


def facts(summary: dict[str, Any], folder: Path) -> Facts:
    """D5: per device, the steady step of each captured mode against eager's (a speed: eager's
    time over the mode's, with the interval over the repeats), its first call in eager steps,
    and what a branch on a tensor's value did under each capture (control_flow.csv)."""
    rows = finished_rows(summary)
    facts: dict[str, str | Phrase] = {}
    for device in DEVICES:
        mine = {r["mode"]: r for r in rows if r["device"] == device}
        facts[f"steady_{device}"], facts[f"first_{device}"] = _graph_device(device, mine)
    control = summary.get("control_flow") or read_csv_rows(folder / "control_flow.csv")
    if not control:
        raise NotMeasured("the study recorded no control-flow capture")
    for key, capture, model in (
        ("branch_eager", "eager", "if"),
        ("branch_compile", "torch.compile", "if"),
        ("branch_export", "torch.export", "if"),
        ("branch_cond", "torch.export", "torch.cond"),
    ):
        row = next(
            (c for c in control if c["capture"] == capture and c["model"].startswith(model)), None
        )
        facts[key] = _branch(row) if row else not_measured(f"the study has no {capture} row")
    return "measured", facts


def _graph_device(device: str, modes: dict[str, dict[str, Any]]) -> tuple[Phrase, Phrase]:
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
            steady.append(name + " " + not_measured(skip_reason([row])))
            continue
        means = (
            f"{fmt_mean(row, 'steady_step_ms', 'steady_step_ms_ci95')} vs "
            f"{fmt_mean(eager, 'steady_step_ms', 'steady_step_ms_ci95')} ms"
        )
        # Timed taking turns (graphs.measure_device): repeat by repeat beside eager's.
        paired = bool(row.get("repeat_started_s")) and len(_repeats(row)) == len(_repeats(eager))
        steady.append(name + " " + speed(_repeats(eager), _repeats(row), means, paired))
        calls = 1000 * float(row["first_call_s"]) / float(eager["steady_step_ms"])
        first.append(
            f"{name} {fmt_num(float(row['first_call_s']))} s, {fmt_count(calls)} eager steps"
        )
    nothing = not_measured("no captured mode ran")
    return (join("; ", steady) if steady else nothing), (join("; ", first) if first else nothing)


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


SPEC = StudySpec(
    name="graphs",
    facts=facts,
    tables=(
        Table(
            (
                "First call (capture and compiling included) and steady training step per device "
                "and mode (mean and 95% interval over the repeats), and what each captured"
            ),
            "results.csv",
        ),
        Table(
            "A branch on a tensor's value under each way of capturing",
            "control_flow.csv",
        ),
    ),
)
