"""The declaration of D7 (serialization's pitfalls, shown by measure.py beside it): the
facts its answer is filled from and what its report section shows (dmls/study_spec.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dmls.report.comparisons import NotMeasured
from dmls.report.phrases import Phrase
from dmls.report.special_answers import finished_rows, not_measured, read_csv_rows, skip_reason
from dmls.report.study import OK
from dmls.report.wording import fmt_count, fmt_sig
from dmls.study_spec import Facts, StudySpec, Table


def facts(summary: dict[str, Any], folder: Path) -> Facts:
    """D7: one value's bytes per format, what each format refuses or changes, shared references
    and cycles, the deepest nesting written and read, and torch.load's refusal of a pickle that
    runs code. Parts that failed are "not measured here" in their own placeholders."""
    rows = finished_rows(summary)
    failed = {r["part"]: r for r in rows if r["status"] != OK}

    def part(name: str) -> list[dict[str, Any]]:
        if name in failed:
            raise NotMeasured(skip_reason([failed[name]]))
        return summary.get(name) or read_csv_rows(folder / f"{name}.csv")

    facts: dict[str, str | Phrase] = {}
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
    fixed = {
        int(r["bytes"]) for r in rows if r["value"] == first and r["format"] in ("struct", "numpy")
    }
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


SPEC = StudySpec(
    name="serialization",
    facts=facts,
    tables=(
        Table(
            (
                "Representation: each value through each format, its size, the round trip, what "
                "the other byte order reads, and what sender and receiver must agree on"
            ),
            "representation.csv",
        ),
        Table(
            "References: an object referenced twice and a cycle",
            "references.csv",
        ),
        Table(
            (
                "Depth: the deepest nested list each format writes and reads, in a fresh "
                "interpreter, and the error one level deeper"
            ),
            "depth.csv",
        ),
        Table(
            "Trust: a state_dict through torch.save, and a pickle that runs code when loaded",
            "trust.csv",
        ),
    ),
    text_tables=True,
)
