"""How a DAG's runs ended, in a few lines for the terminal (Snakemake's onsuccess/onerror):
per study how many runs finished, were skipped or failed, each distinct reason once, and where
the report is. Snakemake's own "100% done" counts jobs, and a skipped run's job succeeds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from dmls import record

STATUSES = ("ok", "diverged", "skipped", "failed")
UNREADABLE = (
    "metrics.json cut short, changed or of another version (the aggregation's error says what); "
    "rebuild it with snakemake --forcerun <that file>"
)


def summary(paths: Iterable[Path], report: Path | None = None) -> str:
    """The lines: one per study, then each reason with the runs it stopped, then the report."""
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
    lines = ["Runs by study:"]
    for study, counts in by_study.items():
        order = [*STATUSES, "not run", "unreadable"]
        parts = [f"{counts[s]} {s}" for s in order if counts[s]]
        lines.append(f"  {study}: {', '.join(parts)}")
    for reason, runs in reasons.items():
        shown = ", ".join(runs[:4]) + (f" and {len(runs) - 4} more" if len(runs) > 4 else "")
        lines.append(f"  {len(runs)} run(s) — {reason}: {shown}")
    if report is not None and Path(report).exists():
        lines.append(f"Report: {report}")
    return "\n".join(lines)
