"""Whether two results folders hold the same outcomes: the check a refactor that must not change
behaviour passes (same seeds, CPU).

    python3 tools/same_outcomes.py results/before results/after

Per training run (runs/<study>/<run>/metrics.json): the status and reason, the per-epoch train
and test loss and accuracy (exactly equal, not within a tolerance: the same code on the same
seeds computes the same floats), the learning rate, and how the steps ran. Per special study
(studies/<name>/summary.json): the status and every row's status and reason. The HTML report:
the same sections, in the same order. Times, hosts and paths are ignored. Exits 1 and lists
every difference when there is one. Each file is read through its owner (dmls/record.py,
dmls/summary.py): one that breaks its schema exits 2, naming it and how to rebuild it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from dmls import record, summary

EPOCH_KEYS = ("epoch", "train_loss", "train_accuracy", "test_loss", "test_accuracy", "lr")
RUN_KEYS = ("status", "reason", "effective_precision", "fp8_linear_layers", "world_size", "step")
ROW_KEYS = ("status", "reason")


def _by_name(root: Path, pattern: str) -> dict[str, Path]:
    return {str(p.parent.relative_to(root)): p for p in sorted(root.glob(pattern))}


def compare_runs(before: Path, after: Path) -> tuple[list[str], int]:
    """Differences between the training runs of two results folders, and how many runs both
    hold."""
    old, new = _by_name(before, "runs/*/*/metrics.json"), _by_name(after, "runs/*/*/metrics.json")
    problems = [f"{run}: only in {before}" for run in sorted(set(old) - set(new))]
    problems += [f"{run}: only in {after}" for run in sorted(set(new) - set(old))]
    for run in sorted(set(old) & set(new)):
        a, b = record.read(old[run]), record.read(new[run])
        for key in RUN_KEYS:
            if a.get(key) != b.get(key):
                problems.append(f"{run}: {key} {a.get(key)!r} -> {b.get(key)!r}")
        history_a, history_b = a.get("history") or [], b.get("history") or []
        if len(history_a) != len(history_b):
            problems.append(f"{run}: {len(history_a)} epochs -> {len(history_b)}")
        for ea, eb in zip(history_a, history_b, strict=False):
            for key in EPOCH_KEYS:
                if ea.get(key) != eb.get(key):
                    problems.append(
                        f"{run}: epoch {ea.get('epoch')} {key} {ea.get(key)!r} -> {eb.get(key)!r}"
                    )
    return problems, len(set(old) & set(new))


def compare_studies(before: Path, after: Path) -> list[str]:
    """Differences between the special studies' outcomes."""
    old = _by_name(before, "studies/*/summary.json")
    new = _by_name(after, "studies/*/summary.json")
    problems = [f"{s}: only in one folder" for s in sorted(set(old) ^ set(new))]
    for study in sorted(set(old) & set(new)):
        a, b = summary.read(old[study]), summary.read(new[study])
        if a["status"] != b["status"]:
            problems.append(f"{study}: status {a['status']!r} -> {b['status']!r}")
        if len(a["rows"]) != len(b["rows"]):
            problems.append(f"{study}: {len(a['rows'])} rows -> {len(b['rows'])}")
        for i, (ra, rb) in enumerate(zip(a["rows"], b["rows"], strict=False)):
            for key in ROW_KEYS:
                if ra.get(key) != rb.get(key):
                    problems.append(f"{study}: row {i} {key} {ra.get(key)!r} -> {rb.get(key)!r}")
    return problems


def report_sections(results: Path) -> list[str]:
    page = (results / "report" / "report.html").read_text()
    return re.findall(r'<section id="([^"]+)"', page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    try:
        problems, runs = compare_runs(args.before, args.after)
        problems += compare_studies(args.before, args.after)
    except (record.RecordError, summary.SummaryError) as e:
        print(e, file=sys.stderr)
        return 2
    sections = report_sections(args.before), report_sections(args.after)
    if sections[0] != sections[1]:
        problems.append(f"report sections {sections[0]} -> {sections[1]}")
    for line in problems:
        print(line)
    print(
        f"{runs} runs, {len(sections[1])} report sections compared: "
        + (f"{len(problems)} difference(s)" if problems else "identical")
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
