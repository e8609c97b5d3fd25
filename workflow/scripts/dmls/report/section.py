"""Build one study's report section: tables, observations and figures, written as files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import pandas as pd
import yaml

from dmls import record
from dmls.files import atomic_write, write_json
from dmls.report import answers, figures, observations, overfitting, quantities
from dmls.report.study import Study


def build(
    study: Study,
    other: Study | None,
    out_dir: Path,
    curves_dir: Path,
    figures_dir: Path,
    collectives: pd.DataFrame | None = None,
    texts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Write `section.json`, `results.csv`, the study's figures and one curve figure per run.
    `collectives` is the collectives sweep's table, where it ran (A5's communication); `texts`
    the report/studies.yaml sections drawn from this study (its own, and A2 from A1's runs),
    whose answers are filled here."""
    curves = [
        {
            "run": run,
            "file": _relative(figures.run_curves(study, run, curves_dir / f"{run}.png"), out_dir),
        }
        for run in study.runs.index
    ]
    figures_dir.mkdir(parents=True, exist_ok=True)
    drawn = figures.study_figures(study, other, figures_dir)
    said = {
        entry["study"]: answers.study_answers(entry, study, other, collectives)
        for entry in texts or []
    }
    section = {
        "key": study.key,
        "title": study.title,
        "baseline": study.baseline,
        "compare_with": other.key if other is not None else None,
        "status": observations.status_summary(study),
        "settings": study.settings_table(),
        "results": study.results_table(),
        "key_results": study.key_table(),
        "key_memory": [column for column, _ in study.key_columns],
        "provenance": study.provenance(),
        "model": study.model_table(),
        "observations": observations.all_observations(study, other, collectives),
        "generalization": overfitting.generalization(study),
        "figures": [{"name": name, "file": _relative(path, out_dir)} for name, path in drawn],
        "curves": curves,
        # Each section's answer to its question, by the section's key (dmls.report.answers),
        # as the report shows it first ("briefs": figures, intervals, verdicts) and whole
        # ("answers": with the means and why a first seed is left out), and the course's
        # figures beside this run's.
        "answers": {key: full for key, (full, _) in said.items()},
        "briefs": {key: brief for key, (_, brief) in said.items()},
        # Each section's background as its runs ran (answers.background: batch, step, device).
        "background": {entry["study"]: answers.background(entry, study) for entry in texts or []},
        "course": {
            entry["study"]: answers.course_comparison(study, entry.get("course_table"))
            for entry in texts or []
        },
    }
    frame = study.results_frame()
    atomic_write(out_dir / "results.csv", lambda f: frame.to_csv(f, index=False))
    write_json(out_dir / "section.json", section)
    return section


def _relative(path: Path, folder: Path) -> str:
    """Paths in section.json are relative to it, so a results folder can be moved whole."""
    return Path(path).resolve().relative_to(Path(folder).resolve()).as_posix()


def main_from_snakemake(snakemake: Any, log: IO[str]) -> None:
    """Entry of the `report_study` rule (workflow/scripts/report_study.py); `log` is the rule's
    log, open (dmls.joblog)."""
    study = Study.from_metrics(
        snakemake.wildcards.study,
        snakemake.params.settings,
        [record.read(p) for p in snakemake.input.metrics],
    )
    other = None
    if snakemake.params.compare_with and snakemake.input.compared:
        other = Study.from_metrics(
            snakemake.params.compare_with,
            snakemake.params.compare_settings,
            [record.read(p) for p in snakemake.input.compared],
        )
    # How much the DAG's identical jobs differ in speed: every speed two runs compare counts it.
    noise = quantities.job_noise(
        [record.read(p) for p in getattr(snakemake.input, "identical", [])]
    )
    study = replace(study, job_noise=noise)
    other = other and replace(other, job_noise=noise)
    sweep = getattr(snakemake.input, "collectives", None)
    texts = [
        entry
        for entry in yaml.safe_load(Path(snakemake.input.texts).read_text())["sections"]
        if (entry.get("from") or entry.get("study")) == study.key
    ]
    built = build(
        study,
        other,
        out_dir=Path(snakemake.output.section).parent,
        curves_dir=Path(snakemake.output.curves),
        figures_dir=Path(snakemake.output.figures),
        collectives=pd.read_csv(sweep) if sweep else None,
        texts=texts,
    )
    print(f"{study.key}: {len(built['figures'])} figures, {len(built['curves'])} runs", file=log)
    print("\n".join(built["status"] + built["observations"]), file=log)
    for key, sentences in built["answers"].items():
        print(f"answer of {key}:", *sentences, sep="\n  ", file=log)
