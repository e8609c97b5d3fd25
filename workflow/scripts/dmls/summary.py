"""The special studies' record: the shape of a study's summary.json, the one place that builds
its frame, writes it and reads it.

A study (dmls/special/<name>/measure.py) returns its rows, each with a status (`ok`, `skipped` where
this host can't do that part, or `failed`) and a reason, and the study's own results (its
payload); the runner (special/runner.py `run_study`) hands them to `new`, which adds what every
summary carries (the overall status and the counts, the config, host, threads and timing), and
writes it through `write`. Every reader (the report's study sections and answers, the DAG's
timeline, tools/same_outcomes.py) reads it through `read`.

The file's shape is summary.schema.json (JSON Schema, versioned by SUMMARY_VERSION; closed: a key
it does not declare, or one another study's payload has, is an error), checked when a summary is
written and when it is read, with what a schema can't state (`bounds`: the counts and the overall
status agree with the rows). Importing this module pulls neither torch nor pandas.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dmls.files import read_checked, read_json, validator_of, write_checked

SUMMARY_VERSION = 2
SCHEMA_PATH = Path(__file__).with_name("summary.schema.json")
# A row's status, and so the study's.
STATUSES = ("ok", "skipped", "failed")


class SummaryError(ValueError):
    """A summary.json that can't be read; the message names it and how to rebuild it."""


def overall_status(rows: list[dict[str, Any]]) -> str:
    """failed if any part failed; skipped if every part was; else ok (with its skips listed)."""
    statuses = {r["status"] for r in rows}
    if "failed" in statuses:
        return "failed"
    return "skipped" if statuses == {"skipped"} else "ok"


def counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many rows have each status (a status no row has is left out)."""
    return dict(Counter(r["status"] for r in rows))


def new(
    study: str,
    title: str,
    result: dict[str, Any],
    *,
    config: dict[str, Any],
    host: dict[str, Any],
    threads: int,
    started_at: str,
    wall_time_s: float,
    reserved: dict[str, Any] | None = None,
    load_average_before: list[float] | None = None,
) -> dict[str, Any]:
    """A study's summary: its `result` (what its `run` returned: `rows` and its payload) in the
    frame every summary carries; `reserved`, the GPUs and cores its job held, where it held
    some; `load_average_before`, the host's load averages (1, 5, 15 minutes) as it began."""
    rows = result["rows"]
    return {
        "summary_version": SUMMARY_VERSION,
        "study": study,
        "title": title,
        "status": overall_status(rows),
        "counts": counts(rows),
        **result,
        "config": config,
        "host": host,
        "threads": threads,
        "started_at": started_at,
        "wall_time_s": wall_time_s,
        **({"reserved": reserved} if reserved else {}),
        **({"load_average_before": load_average_before} if load_average_before else {}),
    }


# Each study's own keys: dmls/special/<name>/summary.schema.json, beside its measuring code.
STUDY_SCHEMAS = Path(__file__).with_name("special")


@functools.cache
def schema() -> dict[str, Any]:
    """summary.schema.json with, for each study that declares its own keys (its folder's
    summary.schema.json, read as data: this module imports no study), a rule that holds its
    summaries to them; a study none declares (a test's) has no payload."""
    base = read_json(SCHEMA_PATH)
    payloads = {
        p.parent.name: read_json(p) for p in sorted(STUDY_SCHEMAS.glob("*/summary.schema.json"))
    }
    rules: list[dict[str, Any]] = [
        {"if": {"properties": {"study": {"const": name}}, "required": ["study"]}, "then": payload}
        for name, payload in payloads.items()
    ]
    unknown = {"not": {"enum": list(payloads)}}
    rules.append(
        {
            "if": {"properties": {"study": unknown}, "required": ["study"]},
            "then": {"propertyNames": {"$ref": "#/$defs/frame_key"}},
            "description": "A study this schema does not know (a test's) has no payload.",
        }
    )
    return base | {"allOf": rules}


@functools.cache
def _validator() -> Any:
    return validator_of(schema())


def _declared() -> set[str]:
    return set(_validator().schema["properties"])


def problems(summary: Any) -> list[str]:
    """What in `summary` breaks the schema, each with where (`rows/3/status`); empty when it is
    a valid summary of this SUMMARY_VERSION."""
    if isinstance(summary, dict) and summary.get("summary_version") != SUMMARY_VERSION:
        return [
            f"summary version {summary.get('summary_version')}, "
            f"this pipeline reads {SUMMARY_VERSION}"
        ]
    found = []
    for e in sorted(_validator().iter_errors(summary), key=lambda e: list(e.absolute_path)):
        where = "/".join(map(str, e.absolute_path)) or "(top)"
        rule = list(e.schema_path)
        if rule[0] != "allOf" or "propertyNames" not in rule:
            found.append(f"{where}: {e.message}")
        # A study's own keys (allOf); an undeclared key, additionalProperties names already.
        elif e.instance in _declared():
            study = summary["study"]
            found.append(f"{where}: {e.instance!r} belongs to another study's summary, not {study}")
    return found or bounds(summary)


def _intervals(value: Any, where: str) -> list[str]:
    """Every interval in `value` (a mapping with `low` and `high`, or `<x>_low` and `<x>_high`,
    at any depth) whose ends are out of order, named by where it is."""
    found = []
    if isinstance(value, dict):
        for key, low in value.items():
            if not (isinstance(key, str) and key.endswith("low")):
                continue
            high_key = key[: -len("low")] + "high"
            high = value.get(high_key)
            numbers = all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high)
            )
            if numbers and low > high:
                found.append(f"{where}{key}: {low:g} is above {high_key} {high:g}")
        children: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list):
        children = enumerate(value)
    else:
        return found
    for key, child in children:
        found += _intervals(child, f"{where}{key}/")
    return found


def bounds(summary: dict[str, Any]) -> list[str]:
    """What a schema can't say of a valid summary: its counts are its rows' and its status is
    the one `overall_status` gives them, and every interval it holds has its low end at or
    below its high end. (What a study's values can be, a probability's 0 to 1, a float32's
    4 bytes, its own summary.schema.json says.)"""
    rows = summary["rows"]
    found = _intervals({k: v for k, v in summary.items() if k != "config"}, "")
    if {k: n for k, n in summary["counts"].items() if n} != counts(rows):
        found.append(f"counts: {summary['counts']}, but the rows have {counts(rows)}")
    if summary["status"] != overall_status(rows):
        found.append(
            f"status: {summary['status']!r}, but the rows make it {overall_status(rows)!r}"
        )
    return found


def rebuild_hint(path: Path) -> str:
    return f"rebuild that study: snakemake --forcerun {path}"


def upgrade(summary: Any) -> Any:
    """A summary of an earlier version read as this one, where nothing measured differs:
    version 1 also held "notes", sentences four studies wrote as they measured; the report
    now writes them from the rows (each study's spec.py `notes`), so they are dropped."""
    if isinstance(summary, dict) and summary.get("summary_version") == 1:
        summary = {k: v for k, v in summary.items() if k != "notes"}
        summary["summary_version"] = 2
    return summary


def read(path: Path) -> dict[str, Any]:
    """One study's summary.json, checked against the schema (one of an earlier version
    `upgrade`d first); SummaryError names the file, what is wrong (the first three problems)
    and the command that writes it again."""
    return read_checked(path, problems, SummaryError, rebuild_hint(path), upgrade)


def write(path: Path, summary: dict[str, Any]) -> None:
    """Write `summary` atomically once it passes the schema (files.write_checked)."""
    write_checked(path, summary, problems, SummaryError)
