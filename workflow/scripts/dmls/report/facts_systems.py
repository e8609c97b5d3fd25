"""The systems studies' facts: D2 (failure with and without a spare), D6 (Spark's lazy
evaluation, line by line) and D7 (serialization's pitfalls).
(report/special_answers.py says what a facts function gives.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from scipy import stats as scipy_stats

from dmls.report.answers import finished_rows, not_measured, read_csv_rows, skip_reason
from dmls.report.comparisons import Facts, NotMeasured
from dmls.report.study import OK
from dmls.report.wording import fmt_count, fmt_num, fmt_percent, fmt_plural, fmt_sig

# D2: misses of the Monte Carlo intervals are put down to chance while the binomial chance of
# at least as many (at the intervals' confidence) is at least this.
CHANCE = 0.05


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
