"""Assemble the one-file HTML report: header, one section per study, the all-runs table.

Everything shown comes from the files of this results folder (run metrics, data manifests,
runs.csv and the study sections); the template lives in report/ and autoescapes every string.
"""

from __future__ import annotations

import base64
import importlib.metadata
import io
import numbers
import subprocess
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, cast

import jinja2
import matplotlib.pyplot as plt
import pandas as pd
import yaml

from dmls import record
from dmls.files import atomic_write, read_json
from dmls.report import captions, special, special_answers, timeline
from dmls.report.cells import FORMATS, MIB, bounds_of, cell, missing, stand_in
from dmls.report.study import ALONE, OK, SHARED
from dmls.study_spec import StudySpec

# Columns of the all-runs table, in this order (the full table is runs.csv, linked from it);
# each number a mean over the run's seeds, shown with its 95% interval where it has one.
ALL_RUNS_COLUMNS = {
    "study": "study",
    "run": "run",
    "status": "status",
    "device": "device",
    "effective_precision": "precision (measured)",
    "processes": "processes",
    "global_batch_size": "global batch",
    "n_seeds": "seeds",
    "test_accuracy": "test acc. (%)",
    "train_accuracy": "train acc. (%)",
    "test_loss": "test loss",
    "train_time_s": "training time (s)",
    "steady_epoch_s": "steady epoch (s)",
    "samples_per_s": "samples/s (steady epoch)",
    "peak_gpu_mem_allocated_bytes": "peak GPU mem. (MiB)",
    "peak_host_rss_bytes": "peak RSS (MiB)",
    "reason": "reason",
}
# Columns of names and words, shown for every run; the others are numbers, shown for `ok` runs.
TEXT_COLUMNS = ("study", "run", "status", "reason", "device")
SOFTWARE = ("snakemake", "torch", "torchvision", "accelerate", "numpy", "pandas", "matplotlib")


def data_uri(path: Path, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(Path(path).read_bytes()).decode()


def git_state(folder: Path) -> str:
    """The commit the workflow ran from, marked when the checkout had local changes."""
    try:
        commit = _git(folder, "rev-parse", "HEAD")
        dirty = _git(folder, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return commit + (" (with uncommitted changes)" if dirty else "")


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(folder), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def wall_time(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """From the first run's start to the last run's end, per sitting (timeline.sittings: runs
    added to the folder after an idle gap are a sitting of their own), and the runs' own time
    summed; `runs` are the runs' timeline rows."""
    rows = timeline.with_offsets(runs)
    if not rows:
        return {"span_s": None, "runs_s": None}
    spans = timeline.sittings(rows)
    return {
        "span_s": spans[-1][1] - spans[0][0],
        "sittings_s": [end - start for start, end in spans],
        "runs_s": sum(r.get("seconds") or 0.0 for r in runs),
    }


def hosts(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each distinct host the runs saw, with what it has and how many runs it ran."""
    seen: dict[str, dict[str, Any]] = {}
    count: Counter[str] = Counter()
    for m in metrics:
        host = m["host"]
        names = {r["hostname"] for r in m.get("ranks", [])} or {host["hostname"]}
        for name in sorted(names):
            # (keyed by the machine, not its name: lent GPU hosts are all "vm")
            key = timeline.machine(host | {"hostname": name})
            count[key] += 1
            seen.setdefault(key, host | {"hostname": name})
    out = []
    for key, host in seen.items():
        name = host["hostname"]
        gpus = Counter(host.get("gpus") or [])
        memory = host.get("gpu_memory_bytes") or []
        out.append(
            {
                "hostname": name,
                "runs": count[key],
                "cpu": f"{host['cpu_model']}, {host['cpu_count']} logical cores",
                "gpus": ", ".join(f"{n} × {g}" for g, n in gpus.items()) or "none",
                "gpu_memory": ", ".join(f"{b / MIB / 1024:.1f} GiB" for b in memory) or "—",
                "driver": host.get("cuda_driver") or "—",
                "cuda": host.get("cuda") or "—",
                "cudnn": host.get("cudnn") or "—",
                "nccl": host.get("nccl") or "—",
                "python": host["python"],
                "torch": host["torch"],
                "accelerate": host["accelerate"],
                "platform": host["platform"],
            }
        )
    return out


def software() -> dict[str, str]:
    versions = {}
    for name in SOFTWARE:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def all_runs(frame: pd.DataFrame) -> dict[str, Any]:
    """The all-runs table; runs that did not finish show their reason and no numbers. A number
    sorts by its mean."""
    rows = []
    for _, row in frame.iterrows():
        ok = row["status"] == OK
        shown = []
        for column in ALL_RUNS_COLUMNS:
            value = row.get(column)
            if column in TEXT_COLUMNS:
                text = sort = cell(value, str)
            elif ok and not missing(value):
                text = cell(
                    value,
                    FORMATS.get(column, str),
                    ci95=row.get(f"{column}_ci95"),
                    bounds=bounds_of(column),
                )
                sort = _sort_key(value)
            else:
                text = sort = ""
            shown.append({"text": text, "sort": sort})
        rows.append({"status": row["status"], "cells": shown})
    return {"columns": list(ALL_RUNS_COLUMNS.values()), "rows": rows}


def _sort_key(value: Any) -> Any:
    """What the table sorts a shown number by: numbers as numbers."""
    # (a real number: numbers.Number itself declares no __float__)
    return float(cast(float, value)) if isinstance(value, numbers.Number) else value


def load_section(path: Path, figure_captions: dict[str, Any]) -> dict[str, Any]:
    """A section.json with its figures inlined as data URIs and captioned
    (report/captions.yaml)."""
    section = read_json(path)
    folder = Path(path).parent
    for item in section["figures"] + section["curves"]:
        item["src"] = data_uri(folder / item["file"], "image/png")
    for item in section["figures"]:
        item["caption"] = captions.for_html(figure_captions, item["name"], section)
    section["overfitting_caption"] = captions.overfitting_for_html(
        figure_captions, section["title"]
    )
    return section


def load_special(path: Path, studies: Mapping[str, StudySpec]) -> dict[str, Any]:
    """A special study's section with its figures and downloads inlined as data URIs, its
    summary and folder (what its answer is computed from) and its declaration (`studies`, by
    name; None for a study this code does not declare)."""
    section = special.load(path, studies) | {"folder": Path(path).parent}
    section["figures"] = [data_uri(Path(f), "image/png") for f in section["figures"]]
    section["downloads"] = [
        {"name": Path(f).name, "href": data_uri(Path(f), "application/gzip")}
        for f in section["downloads"]
    ]
    return section


def arrange(
    sections: list[dict[str, Any]],
    specials: list[dict[str, Any]],
    texts: dict[str, Any],
    config: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Sections in the order of report/studies.yaml, each with its text; A2 is drawn from A1's
    runs. A study of the text file this folder did not run is listed with why (`absent`),
    never silently left out. Studies the text file doesn't know come last, with their numbers
    only."""
    by_key = {s["key"]: s for s in sections}
    special_by_key = {s["key"]: s for s in specials}
    out = []
    for entry in texts["sections"]:
        if "special" in entry:
            if entry["special"] in special_by_key:
                out.append(_item(entry, special_by_key[entry["special"]], kind="special"))
            else:
                out.append(absent(entry, config or {}))
            continue
        source = by_key.get(entry.get("from") or entry["study"])
        if source is not None:
            out.append(_item(entry, source, kind="derived" if "from" in entry else "runs"))
        else:
            out.append(absent(entry, config or {}))
    known = {e.get("from") or e.get("study") for e in texts["sections"]}
    known |= {e["special"] for e in texts["sections"] if "special" in e}
    out += [_item({"study": k}, s, kind="runs") for k, s in by_key.items() if k not in known]
    out += [
        _item({"study": k}, s, kind="special") for k, s in special_by_key.items() if k not in known
    ]
    return out


def absent(entry: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """A study of report/studies.yaml this folder has no results of: its answer says why (the
    config turns it off, or has no such study), and its section shows only that."""
    if "special" in entry:
        key = entry["special"]
        settings = (config.get("special_studies") or {}).get(key)
        if settings is None:
            why = f"Not run: this folder's config has no special study {key}."
        elif not settings.get("enabled", True):
            why = (
                f"Not run: this folder's config turns it off (special_studies.{key}.enabled: "
                "false)."
            )
        else:
            why = f"Not run: no results of {key} were found in this folder."
    else:
        key = entry.get("from") or entry["study"]
        settings = (config.get("studies") or {}).get(key)
        if settings is None:
            why = f"Not run: this folder's config has no study {key}."
        elif not settings.get("runs"):
            why = f"Not run: this folder's config gives it no runs (studies.{key}.runs is empty)."
        else:
            why = f"Not run: no results of {key} were found in this folder."
    study = entry.get("special") or entry.get("study")
    title = entry.get("title") or ((config.get("studies") or {}).get(key) or {}).get("title")
    text: dict[str, Any]
    text = {"study": study, "title": title or study, "question": None,
            "background": [], "measured_elsewhere": [], "course_reference": None}  # fmt: skip
    return {
        "entry": text | entry,
        "section": {"key": study},
        "provenance": None,
        "kind": "absent",
        "answer": [why],
        "brief": [why],
        "no_answer": "",
    }


def _item(entry: dict[str, Any], section: dict[str, Any], kind: str) -> dict[str, Any]:
    text = {
        "study": entry.get("special") or entry.get("study"),
        "title": section["title"],
        "question": None,
        "background": [],
        "measured_elsewhere": [],
        "course_reference": None,
    }
    key = text["study"]
    course_data = entry.get("course_data")
    brief = None
    provenance: str | dict[str, Any]  # a special study's line, a run study's facts
    if kind == "special" and (spec := section["spec"]) is not None:
        answer, brief = special_answers.special_answer(
            entry.get("answer"), spec.facts, section["summary"], section["folder"]
        )
        provenance = special.provenance(section["summary"], spec.repeats, course_data)
    elif kind == "special":
        answer, provenance = [], special.provenance(section["summary"], course_data=course_data)
    else:
        answer = section.get("answers", {}).get(key, [])
        brief = section.get("briefs", {}).get(key)
        provenance = dict(section.get("provenance") or {})  # (the item's own: A2 shares A1's)
        if provenance and course_data:  # ("data" names the data set; "dataset" its key)
            dataset = provenance.get("dataset", provenance["data"])
            provenance["data"] += stand_in(dataset, course_data)
    entry = text | entry
    if filled := (section.get("background") or {}).get(key):  # (as the runs ran: answers)
        entry = entry | {"background": filled}
    return {
        "entry": entry,
        "section": section,
        "kind": kind,
        "answer": answer,
        # The answer as the Answers list and the section's first screen give it
        # (answers.study_answers); the whole answer, with the means, one click away where it
        # says more.
        "brief": brief or answer,
        # What it ran on: a special study's line, or a run section's parts (report.html.j2).
        "provenance": provenance,
        "no_answer": "report/studies.yaml gives this study no answer to compute.",
    }


def describe_each_model_once(items: list[dict[str, Any]]) -> None:
    """The model-as-it-ran table under the first section that trained each model (A1's CNN,
    B1's MLP); a later section of the same model shows none (`model_shown`: False)."""
    shown: list[Any] = []
    for item in items:
        model = (item["section"].get("model") or {}).get("rows")
        item["model_shown"] = bool(model) and model not in shown
        if item["model_shown"]:
            shown.append(model)


def ran_alone(key: str, rows: list[dict[str, Any]]) -> bool:
    """Whether no finished run of study `key` overlapped another job in time: `rows` are the
    timeline's rows of every run and special study of the folder (a skipped run did no work)."""
    spans = [r for r in rows if r.get("start") is not None and r.get("end") is not None]
    mine = [r for r in spans if r["job"].startswith(f"{key}/") and r["status"] == OK]
    others = [r for r in spans if r["status"] != "skipped"]
    return bool(mine) and not any(
        o is not r and o["start"] < r["end"] and r["start"] < o["end"] for r in mine for o in others
    )


def say_who_ran_alone(items: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """A section whose runs could share the host (`isolation: devices`) but overlapped no
    other job says so in its provenance line (the example report's B1 and B2 ran one run at a
    time after the DAG); a special study's line says what else ran while it did
    (timeline.beside, from the recorded stamps)."""
    for item in items:
        p = item["provenance"]
        if item["kind"] == "special" and isinstance(p, str) and p:
            if shared := timeline.beside(f"study {item['entry']['study']}", rows):
                item["provenance"] = f"{p.removesuffix('.')}; {shared}."
            continue
        runs = item["kind"] in ("runs", "derived") and p
        if (
            runs
            and p.get("isolation") == SHARED["devices"]
            and ran_alone(item["section"]["key"], rows)
        ):
            p["isolation"] = ALONE


def timeline_section(jobs: list[dict[str, Any]]) -> dict | None:
    """The DAG's timeline (a figure, inlined) and each job's split, from the timeline rows of
    every run and special study, or None without stamps."""
    rows = timeline.with_offsets(jobs)
    if not rows:
        return None
    fig = timeline.figure(rows)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    src = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    return {"src": src, "table": timeline.table(rows), "summary": timeline.summary(rows)}


def render(
    *,
    template_dir: Path,
    texts_path: Path,
    section_paths: list[Path],
    special_paths: list[Path],
    runs_csv: Path,
    seeds_csv: Path,
    metrics_paths: list[Path],
    manifest_paths: list[Path],
    config: dict[str, Any],
    workflow_dir: Path,
    studies: Mapping[str, StudySpec],
) -> str:
    """The report's HTML; `studies` are the special studies' declarations, by name
    (dmls/special/catalog.py, handed over by the entry script)."""
    metrics = [record.read(p) for p in metrics_paths]
    frame = pd.read_csv(runs_csv)
    texts = yaml.safe_load(Path(texts_path).read_text())
    figure_captions = captions.load(Path(template_dir) / "captions.yaml")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_dir),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    statuses = frame["status"].value_counts().to_dict()
    specials = [load_special(p, studies) for p in special_paths]
    loaded = [load_section(p, figure_captions) for p in section_paths]
    sections = arrange(loaded, specials, texts, config)
    describe_each_model_once(sections)
    # Every job's span, once: the header's wall time, the timeline, and who ran alone.
    runs = [timeline.run_row(m) for m in metrics]
    jobs = runs + [timeline.study_row(s["summary"]) for s in specials]
    say_who_ran_alone(sections, jobs)
    context = {
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_state(workflow_dir),
        "wall": wall_time(runs),
        "config_yaml": yaml.safe_dump(config, sort_keys=False, allow_unicode=True),
        "hosts": hosts(metrics),
        "software": software(),
        "data": [read_json(p) for p in manifest_paths],
        "emulated": [
            f"{m['study']}/{m['run']}"
            for m in metrics
            if m["derived"].get("nodes_emulated") and m["status"] == OK
        ],
        "statuses": statuses,
        "sections": sections,
        "intro": texts["intro"],
        "terms": texts.get("terms") or {},
        "all_runs": all_runs(frame),
        "timeline": timeline_section(jobs),
        "runs_csv_uri": data_uri(runs_csv, "text/csv"),
        "seeds_csv_uri": data_uri(seeds_csv, "text/csv"),
        "css": (Path(template_dir) / "report.css").read_text(),
    }
    return env.get_template("report.html.j2").render(**context)


def main_from_snakemake(snakemake: Any, log: IO[str], studies: Mapping[str, StudySpec]) -> None:
    """Entry of the `render_report` rule (workflow/scripts/render_report.py, which hands over
    the special studies' declarations, `studies`); `log` is the rule's log, open
    (dmls.joblog)."""
    page = render(
        template_dir=Path(snakemake.input.template).parent,
        texts_path=Path(snakemake.input.texts),
        section_paths=[Path(p) for p in snakemake.input.sections],
        special_paths=[Path(p) for p in snakemake.input.specials],
        runs_csv=Path(snakemake.input.runs),
        seeds_csv=Path(snakemake.input.seeds),
        metrics_paths=[Path(p) for p in snakemake.input.metrics],
        manifest_paths=[Path(p) for p in snakemake.input.manifests],
        config=snakemake.params.config,
        workflow_dir=Path(snakemake.params.workflow_dir),
        studies=studies,
    )
    atomic_write(Path(snakemake.output.html), lambda f: f.write(page.encode()))
    print(f"{snakemake.output.html}: {len(page) / 2**20:.1f} MiB", file=log)
