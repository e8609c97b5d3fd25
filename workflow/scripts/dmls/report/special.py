"""Report sections of the special studies (B4, C, D1-D7) from their results/studies/<name>/ files.

Each study wrote a summary.json (status per row, with the reason where a part could not run),
CSV tables and PNG figures (dmls.special.runner); its declaration (`StudySpec`, dmls/special/
<name>_spec.py, handed to the report by its entry script) says which of them its section shows;
this module only selects and formats them. A study without a declaration shows its figures and
the rows it skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pandas as pd

from dmls.report.cells import cell, data_name, number, stand_in
from dmls.report.timeline import machine
from dmls.study_spec import StudySpec
from dmls.summary import read as read_summary

# Columns that name a row rather than measure it: kept for rows that have no numbers.
IDENTIFIERS = {
    "depth",
    "device",
    "mode",
    "title",
    "activation",
    "kind",
    "optimizer",
    "precision",
    "recompute",
    "device_name",
    "model",
    "capture",
    "backend",
    "op",
    "strategy",
    "stage",
    "processes",
    "placement",
    "variant",
    "line",
    "code",
}


def provenance(
    summary: dict[str, Any],
    repeats: tuple[tuple[str, str], ...] = (("repeats", "repeats"),),
    course_data: str | None = None,
) -> str:
    """What a special study ran on, for the line under its answer: its data (real or
    synthetic, samples, epochs) where it trains, what it repeats (`repeats`: its declaration's
    config keys, with their words), and where its parts ran (the GPU's name, the CPU), from its
    summary; `course_data`, the data set the course used (report/studies.yaml), is named where
    ours stands in for it; the host's 1-minute load as it began, where recorded."""
    cfg, host = summary.get("config") or {}, summary.get("host") or {}
    parts = []
    if dataset := cfg.get("dataset"):
        data = data_name(dataset) + stand_in(dataset, course_data)
        if samples := cfg.get("train_samples"):
            data += f", {samples:,} training samples"
        if epochs := cfg.get("epochs"):
            data += f", {epochs} epoch{'s' if epochs != 1 else ''}"
        parts.append(data)
    parts += [f"{cfg[key]} {what}" for key, what in repeats if isinstance(cfg.get(key), int)]
    ran = [r for r in summary["rows"] if r["status"] == "ok"]
    seen = {r.get("device") or ("cpu" if r.get("mode") == "cpu" else None) for r in ran}
    devices = sorted(cast("set[str]", seen - {None}))
    named = {
        "cuda": f"{host['gpus'][0]} (GPU)" if host.get("gpus") else "the GPU",
        "cpu": f"the CPU ({host['cpu_model']})" if host.get("cpu_model") else "the CPU",
    }
    where = [named.get(d, d) for d in devices] or [machine(host)]
    if ran and any("mode" in r and "device" not in r and r["mode"] != "cpu" for r in ran):
        where = [named["cuda"], *(w for w in where if w != named["cuda"])]  # (C's GPU modes)
    said = f"Ran on {'; '.join(parts) + '; ' if parts else ''}{' and '.join(where)}"
    if load := summary.get("load_average_before"):  # what else ran on the host, as measured
        cores = f"/{host['cpu_count']} cores" if host.get("cpu_count") else ""
        said += f"; load {load[0]:.1f}{cores}"  # (as it began: the term "load" says so)
    return said + "."


def load(summary_path: Path, studies: Mapping[str, StudySpec]) -> dict[str, Any]:
    """One special study's section: its declaration (`spec`: from `studies`, by the summary's
    name; None for a study this code does not declare), the tables, facts, texts and downloads
    it names, every figure of its folder, and its summary (read once, through
    dmls.summary.read: a damaged one is named, with how to rebuild it)."""
    folder = Path(summary_path).parent
    summary = read_summary(summary_path)
    spec = studies.get(summary["study"])
    text = {"dtype": str, "keep_default_na": False} if spec and spec.text_tables else {}
    tables = [
        _table(t.caption, pd.read_csv(folder / t.file, **text), t.columns)
        for t in (spec.tables if spec else ())
        if (folder / t.file).exists()
    ]
    row = summary["rows"][0] if summary["rows"] else {}
    shown = spec.shown_facts if spec else ()
    facts = [(k, row[k]) for k in shown if k in row and row.get("status") == "ok"]
    return {
        "key": summary["study"],
        "spec": spec,
        "title": summary["title"],
        "status": summary["status"],
        "skipped": [
            f"{_row_name(r)}: {r['status']} — {r['reason']}"
            for r in summary["rows"]
            if r["status"] != "ok"
        ],
        "notes": spec.notes(summary) if spec and spec.notes else [],
        "tables": tables,
        "facts": facts,
        "texts": [
            {"caption": t.caption, "text": (folder / t.file).read_text()}
            for t in (spec.texts if spec else ())
            if (folder / t.file).exists() and (folder / t.file).stat().st_size
        ],
        "figures": sorted(str(p) for p in folder.glob("*.png")),
        "downloads": sorted(str(p) for p in folder.glob(spec.downloads))
        if spec and spec.downloads
        else [],
        "host": summary["host"],
        "machine": machine(summary["host"]),
        "summary": summary,
    }


def _table(caption: str, frame: pd.DataFrame, columns: tuple[str, ...] | None) -> dict[str, Any]:
    """A CSV as rows of text; a row whose status is not ok keeps its reason and no numbers."""
    frame = frame[[c for c in (columns or frame.columns) if c in frame.columns]]
    has_status = "status" in frame.columns
    shown = [c for c in frame.columns if c not in ("status", "reason")]
    rows = []
    for _, row in frame.iterrows():
        ok = not has_status or row["status"] == "ok"
        rows.append(
            {
                "status": row["status"] if has_status else "ok",
                "reason": "" if ok else str(row.get("reason", "")),
                "cells": [cell(row[c], number, shown=ok or c in IDENTIFIERS) for c in shown],
            }
        )
    return {"caption": caption, "columns": shown, "status": has_status, "rows": rows}


def _row_name(row: dict[str, Any]) -> str:
    keys = ("backend", "device", "activation", "depth", "mode", "optimizer", "precision",
            "recompute", "processes", "placement", "strategy")  # fmt: skip
    return " ".join(str(row[k]) for k in keys if k in row)
