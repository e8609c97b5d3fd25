"""The declaration of D2 (failure with and without a spare, computed by
measure.py beside it): the facts its answer is filled from and what its report section
shows (dmls/study_spec.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dmls import stats
from dmls.report.comparisons import NotMeasured
from dmls.report.special_answers import finished_rows, read_csv_rows
from dmls.report.study import OK
from dmls.report.wording import fmt_num, fmt_percent, fmt_sig
from dmls.study_spec import Facts, StudySpec, Table


def facts(summary: dict[str, Any], folder: Path) -> Facts:
    """D2: the first vector's failure probabilities without and with a spare and the spare's
    reduction, closed form with the Monte Carlo estimate and interval; and whether every
    closed form (the vectors' and the curve's, curve.csv) lies in its Monte Carlo interval,
    checked from the numbers (not the within_ci flag). Cases: "all_within"; "within_chance"
    where some lie outside but no more than chance explains (stats.misses_tail and
    stats.by_chance: at the one rule's level); "outside" where more do."""
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
    tail = stats.misses_tail(outside, total, confidence)
    case = "all_within" if not outside else "within_chance" if stats.by_chance(tail) else "outside"

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


SPEC = StudySpec(
    name="spare_failure",
    cases=("all_within", "within_chance", "outside"),
    facts=facts,
    tables=(
        Table(
            "Closed forms against Monte Carlo, per failure-probability vector",
            "vectors.csv",
        ),
    ),
)
