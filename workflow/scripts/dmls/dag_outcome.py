"""What a DAG will replace, as it starts (`replaced`: runs whose results were made with other
settings), and how it ended, in a few lines for the terminal (Snakemake's onsuccess/onerror):
per study how many runs finished, were skipped or failed, each distinct reason once with every
run it stopped; each special study's status and the reasons of its skipped parts; where the
report is, and whether this invocation built it; and, where the DAG stopped or failed, what was
kept and how to go on. Snakemake's own "100% done" counts jobs; a skipped run's job succeeds."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dmls import record
from dmls import summary as studies_record
from dmls.config.studies import flatten

STATUSES = ("ok", "diverged", "skipped", "failed")
UNREADABLE = (
    "metrics.json cut short, changed or of another version (the aggregation's error says what); "
    "rebuild it with snakemake --forcerun <that file>"
)
# What a stopped or failed DAG leaves, and how to go on (Snakemake's own lines don't say).
STOPPED = (
    "The DAG stopped before its end: every finished run and study is kept (a metrics.json or "
    "summary.json is written last, whole), an interrupted run resumes from its last epoch's "
    "checkpoint, and the same command goes on from here; the report is built at the end."
)


def summary(
    paths: Iterable[str | Path],
    report: Path | None = None,
    studies: Iterable[str | Path] = (),
    started: float | None = None,
    stopped: bool = False,
) -> str:
    """The lines: one per study, then each reason with every run it stopped; the special
    studies (`studies`: their summary.json paths); the report, said to be an earlier one where
    it is older than `started` (this invocation's start, epoch seconds); `STOPPED` where the
    DAG did not finish."""
    lines = ["Runs by study:", *_runs(paths)]
    if studies := list(studies):
        lines += ["Special studies:", *_studies(studies)]
    if report is not None and Path(report).exists():
        built = Path(report).stat().st_mtime
        if started is None or built >= started:
            lines.append(f"Report: {report}")
        else:
            when = dt.datetime.fromtimestamp(built).strftime("%Y-%m-%d %H:%M")
            lines.append(f"Report not built by this invocation; the last one ({when}): {report}")
    if stopped:
        lines.append(STOPPED)
    return "\n".join(lines)


def replaced(planned: dict[str, dict], results: Path) -> str:
    """Where runs of `planned` (run id -> its spec, as this invocation resolves it) already
    have results made with other settings, which Snakemake will train again and replace
    (their params changed): how many, the settings that changed with their old and new values,
    and how to keep them; "" where none. Before: `--config seeds=1` on a finished folder
    retrained all 54 runs without a word."""
    changed: dict[str, list[str]] = {}
    for run_id, spec in planned.items():
        path = Path(results) / "runs" / run_id / "metrics.json"
        if not path.exists():
            continue
        try:
            old = flatten(record.read(path)["spec"])
        except record.RecordError:
            continue  # (an unreadable record is rebuilt anyway, and the summary names it)
        new = flatten(json.loads(json.dumps(spec)))  # (as the record holds it: lists)
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                change = f"{key} {old.get(key)} → {new.get(key)}"
                changed.setdefault(change, []).append(run_id)
    runs = sorted({r for ids in changed.values() for r in ids})
    if not runs:
        return ""
    what = "; ".join(f"{change} ({len(ids)} run(s))" for change, ids in changed.items())
    return (
        f"{len(runs)} run(s) with results in {results} will train again and replace them: "
        f"their settings changed since ({what}). To keep them, stop now (Ctrl-C) and run with "
        "the settings they were made with, or another results_dir."
    )


def _runs(paths: Iterable[str | Path]) -> list[str]:
    by_study: dict[str, Counter] = {}
    reasons: dict[str, list[str]] = {}
    for path in paths:
        path = Path(path)
        study, run = path.parent.parent.name, path.parent.name
        counts = by_study.setdefault(study, Counter())
        if not path.exists():
            counts["not run"] += 1
            continue
        try:
            metrics = record.read(path)
        except record.RecordError:
            counts["unreadable"] += 1
            reasons.setdefault(UNREADABLE, []).append(f"{study}/{run}")
            continue
        counts[metrics["status"]] += 1
        if metrics["status"] != "ok":
            reasons.setdefault(metrics["reason"] or "", []).append(f"{study}/{run}")
    lines = []
    for study, counts in by_study.items():
        order = [*STATUSES, "not run", "unreadable"]
        parts = [f"{counts[s]} {s}" for s in order if counts[s]]
        lines.append(f"  {study}: {', '.join(parts)}")
    for reason, runs in reasons.items():  # (every run: a cut list hides which ones)
        lines.append(f"  {len(runs)} run(s) — {reason}: {', '.join(runs)}")
    return lines


def _studies(paths: list[str | Path]) -> list[str]:
    """Per special study: its status and how many parts ran; each reason of a part not ok once,
    with the parts it stopped."""
    reasons: dict[tuple[str, str, str], list[dict[str, Any]]]
    lines, reasons = [], {}
    for path in map(Path, paths):
        name = path.parent.name
        if not path.exists():
            lines.append(f"  {name}: not run")
            continue
        try:
            found = studies_record.read(path)
        except studies_record.SummaryError:
            lines.append(f"  {name}: unreadable (rebuild it with snakemake --forcerun {path})")
            continue
        rows = found["rows"]
        ok = sum(r["status"] == "ok" for r in rows)
        lines.append(f"  {name}: {found['status']}, {ok} of {len(rows)} parts ran")
        for r in rows:
            if r["status"] != "ok":
                reasons.setdefault((name, r["status"], r.get("reason") or ""), []).append(r)
    for (name, status, reason), rows in reasons.items():
        lines.append(f"  {name}: {len(rows)} part(s) {status} — {reason}")
    return lines
