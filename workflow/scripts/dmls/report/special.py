"""Report sections of the special studies (B4, C, D1-D7) from their results/studies/<name>/ files.

Each study wrote a summary.json (status per row, with the reason where a part could not run),
CSV tables and PNG figures (dmls.special.runner); this module only selects and formats them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from dmls.report.cells import cell, data_name, number, stand_in
from dmls.summary import read as read_summary

# Per study: the tables to show, as (caption, CSV file, columns; None = all of them).
TABLES: dict[str, list[tuple[str, str, list[str] | None]]] = {
    "profiler": [
        (
            "Time (ms) and memory (KiB) per module kind, summed over the profiled test batches: "
            "mean over the repeats and, in the _ci95 columns, the half-width of its 95% interval",
            "modules.csv",
            [
                "device",
                "activation",
                "kind",
                "modules",
                "calls",
                "repeats",
                "cpu_time_ms_mean",
                "cpu_time_ms_ci95",
                "cpu_self_time_ms_mean",
                "cpu_self_time_ms_ci95",
                "cpu_memory_kib_mean",
                "cpu_memory_kib_ci95",
                "device_time_ms_mean",
                "device_time_ms_ci95",
                "device_memory_kib_mean",
                "device_memory_kib_ci95",
            ],
        ),
    ],
    "fused_conv": [
        (
            "Forward and backward time (s, summed over a training's steps after the warm-up) and "
            "test accuracy (fraction) per network and mode: mean over the repeats and, in the "
            "_ci95 columns, the half-width of its 95% interval",
            "results.csv",
            [
                "depth",
                "title",
                "status",
                "reason",
                "device_name",
                "fused_layers",
                "epochs",
                "repeats",
                "forward_time_s",
                "forward_time_s_ci95",
                "backward_time_s",
                "backward_time_s_ci95",
                "test_accuracy",
                "test_accuracy_ci95",
            ],
        ),
    ],
    "lenet_memory": [
        ("Parameters per layer: the model against the closed form", "parameters.csv", None),
        ("Training-memory estimate (bytes)", "estimate.csv", None),
        (
            "Measured peaks against the estimate (bytes)",
            "measured.csv",
            [
                "device",
                "optimizer",
                "precision",
                "recompute",
                "status",
                "reason",
                "peak_bytes",
                "estimate_total_bytes",
                "difference_bytes",
                "measured_over_estimate",
            ],
        ),
    ],
    "spare_failure": [
        ("Closed forms against Monte Carlo, per failure-probability vector", "vectors.csv", None),
    ],
    "float32_bytes": [("The bytes of the float32 in both byte orders", "bytes.csv", None)],
    "graphs": [
        (
            "First call (capture and compiling included) and steady training step per device "
            "and mode (mean and 95% interval over the repeats), and what each captured",
            "results.csv",
            None,
        ),
        ("A branch on a tensor's value under each way of capturing", "control_flow.csv", None),
    ],
    "collectives": [
        (
            "Latency (median of the timed calls) and bandwidth (nccl-tests' algbw and busbw) "
            "per backend, tensor device, collective and message size",
            "collectives.csv",
            None,
        ),
    ],
    "sharding": [
        (
            "Memory per rank (the most loaded rank) by strategy and N: parameters, gradients and "
            "Adam state measured from the tensors, against the closed form and the split the "
            "implementation makes; the allocator's peak (GPU) against the predicted one; step "
            "time (mean and 95% interval over the timed epochs) and the collectives' time the "
            "sweep predicts",
            "sharding.csv",
            None,
        ),
    ],
    "spark_lazy": [
        (
            "Per line of the program, without and with cache() before count(): the jobs it "
            "started, their stages run and skipped, tasks run, and the rows its scans read",
            "lines.csv",
            [
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
            ],
        ),
    ],
    "serialization": [
        (
            "Representation: each value through each format, its size, the round trip, what "
            "the other byte order reads, and what sender and receiver must agree on",
            "representation.csv",
            None,
        ),
        ("References: an object referenced twice and a cycle", "references.csv", None),
        (
            "Depth: the deepest nested list each format writes and reads, in a fresh "
            "interpreter, and the error one level deeper",
            "depth.csv",
            None,
        ),
        (
            "Trust: a state_dict through torch.save, and a pickle that runs code when loaded",
            "trust.csv",
            None,
        ),
    ],
}
# Text files shown as written, as (caption, file): D6's plans.
TEXTS = {
    "spark_lazy": [
        (
            "Plans: both chains once every line had run (parsed, analyzed, optimized logical, "
            "physical), then each action's plan as it ran (with AQE, the final plan)",
            "plans.txt",
        ),
    ],
}
# Studies whose tables hold values as text ('nan', integers beyond 2^53): read as written.
TEXT_TABLES = {"serialization"}
# Facts of a single-row summary shown as a definition list (D3).
FACTS = {
    "float32_bytes": [
        "value",
        "bits_hex",
        "bits_binary",
        "sign",
        "exponent_biased",
        "exponent",
        "fraction_hex",
        "significand",
        "stored_value_exact",
        "stored_value_fraction",
        "relative_rounding_error",
        "bytes_little_endian",
        "bytes_big_endian",
        "round_trip_little_endian",
        "round_trip_big_endian",
        "round_trip_exact",
        "host_byte_order",
        "native_matches",
    ],
}
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
# Files the report offers for download (inlined), relative to the study's folder.
DOWNLOADS = {"profiler": "traces/*.json.gz"}


# What a study repeats, by its config key, in the order a provenance line gives them.
REPEATS = (("repeats", "repeats"), ("iterations", "timed calls per size"), ("steps", "steps"))


def provenance(summary: dict[str, Any], course_data: str | None = None) -> str:
    """What a special study ran on, for the line under its answer: its data (real or
    synthetic, samples, epochs) where it trains, its repeats, and where its parts ran (the
    GPU's name, the CPU), from its summary; `course_data`, the data set the course used (report/
    studies.yaml), is named where ours stands in for it."""
    cfg, host = summary.get("config") or {}, summary.get("host") or {}
    parts = []
    if dataset := cfg.get("dataset"):
        data = data_name(dataset) + stand_in(dataset, course_data)
        if samples := cfg.get("train_samples"):
            data += f", {samples:,} training samples"
        if epochs := cfg.get("epochs"):
            data += f", {epochs} epoch{'s' if epochs != 1 else ''}"
        parts.append(data)
    parts += [f"{cfg[key]} {what}" for key, what in REPEATS if isinstance(cfg.get(key), int)]
    ran = [r for r in summary["rows"] if r["status"] == "ok"]
    devices = sorted({r.get("device") or ("cpu" if r.get("mode") == "cpu" else None)
                      for r in ran} - {None})  # fmt: skip
    named = {
        "cuda": f"{host['gpus'][0]} (GPU)" if host.get("gpus") else "the GPU",
        "cpu": f"the CPU ({host['cpu_model']})" if host.get("cpu_model") else "the CPU",
    }
    where = [named.get(d, d) for d in devices] or [f"host {host.get('hostname', '?')}"]
    if ran and any("mode" in r and "device" not in r and r["mode"] != "cpu" for r in ran):
        where = [named["cuda"], *(w for w in where if w != named["cuda"])]  # (C's GPU modes)
    return f"Ran on {'; '.join(parts) + '; ' if parts else ''}{' and '.join(where)}."


def load(summary_path: Path) -> dict[str, Any]:
    """One special study's section: its tables, facts, figures and downloads, and its summary
    (read once, through dmls.summary.read: a damaged one is named, with how to rebuild it)."""
    folder = Path(summary_path).parent
    summary = read_summary(summary_path)
    key = summary["study"]
    text = {"dtype": str, "keep_default_na": False} if key in TEXT_TABLES else {}
    tables = [
        _table(caption, pd.read_csv(folder / name, **text), columns)
        for caption, name, columns in TABLES.get(key, [])
        if (folder / name).exists()
    ]
    row = summary["rows"][0] if summary["rows"] else {}
    facts = [(k, row[k]) for k in FACTS.get(key, []) if k in row and row.get("status") == "ok"]
    return {
        "key": key,
        "title": summary["title"],
        "status": summary["status"],
        "skipped": [
            f"{_row_name(r)}: {r['status']} — {r['reason']}"
            for r in summary["rows"]
            if r["status"] != "ok"
        ],
        "notes": summary.get("notes") or [],
        "tables": tables,
        "facts": facts,
        "texts": [
            {"caption": caption, "text": (folder / name).read_text()}
            for caption, name in TEXTS.get(key, [])
            if (folder / name).exists() and (folder / name).stat().st_size
        ],
        "figures": sorted(str(p) for p in folder.glob("*.png")),
        "downloads": sorted(str(p) for p in folder.glob(DOWNLOADS.get(key, "-"))),
        "host": summary["host"],
        "summary": summary,
    }


def _table(caption: str, frame: pd.DataFrame, columns: list[str] | None) -> dict[str, Any]:
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
