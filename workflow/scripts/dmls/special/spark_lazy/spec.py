"""The declaration of D6 (Spark's lazy evaluation, line by line, run by
measure.py beside it): the facts its answer is filled from and what its report section
shows (dmls/study_spec.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dmls.report.comparisons import NotMeasured
from dmls.report.phrases import Phrase
from dmls.report.special_answers import finished_rows, not_measured, skip_reason
from dmls.report.study import OK
from dmls.report.wording import fmt_plural
from dmls.study_spec import Facts, StudySpec, Table, Text


def facts(summary: dict[str, Any], folder: Path) -> Facts:
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
        "ran the chain again from its source"
        if source
        else "read the cached rows, not the source"
        if cache
        else "read nothing"
    )
    said = ", ".join(f"{name} read {fmt_plural(n, 'row')}" for name, n in read.items())
    return f"{verdict} ({fmt_plural(int(row['jobs']), 'job')}{': ' + said if said else ''})"


def _optimized(summary: dict[str, Any], chain: str) -> str | Phrase:
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


SPEC = StudySpec(
    name="spark_lazy",
    facts=facts,
    tables=(
        Table(
            (
                "Per line of the program, without and with cache() before count(): the jobs it "
                "started, their stages run and skipped, tasks run, and the rows its scans read"
            ),
            "lines.csv",
            (
                "variant",
                "line",
                "code",
                "status",
                "reason",
                "jobs",
                "stages_run",
                "stages_skipped",
                "tasks",
                "rows_scanned",
                "job_stages",
            ),
        ),
    ),
    texts=(
        Text(
            (
                "Plans: both chains once every line had run (parsed, analyzed, optimized logical,"
                " physical), then each action's plan as it ran (with AQE, the final plan)"
            ),
            "plans.txt",
        ),
    ),
)
