"""What a special study is, declared once beside its module, as torchtitan's `TrainSpec` declares
a model family: where its measuring code lives, the facts its answer is filled from, the tables,
texts and downloads its report section shows, and what its provenance line counts.

A study `x` is one folder, `dmls/special/x/`: measured by its `measure.py` (`run(cfg, out_dir,
*, data_dir, threads)`) and declared by its `spec.py` (`SPEC`); `dmls/special/catalog.py`
registers every SPEC by its folder's name.
This module sits below both the report and the special studies (beside `summary.py`, the
studies' record): a declaration imports no torch, the report reads it (its entry script hands
it the catalog), and the measuring code is imported only when the study runs
(`StudySpec.measure`).
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What a study's facts function gives: the answer's case and its facts, written as text.
Facts = tuple[str, dict[str, Any]]  # (text, or dmls.report.phrases.Phrase)


@dataclass(frozen=True)
class Table:
    """A CSV of the study's folder shown as a table: `columns` in that order (None: all)."""

    caption: str
    file: str
    columns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Text:
    """A text file of the study's folder shown as written (D6's plans)."""

    caption: str
    file: str


@dataclass(frozen=True)
class StudyJob:
    """What a special study's job is, for the rule made from it (rules/special_studies.smk):
    declared in its folder's `__init__.py` (`JOB`), which imports nothing else, so that
    Snakemake reads it while it parses the workflow without loading the report or torch.

    - `outputs`: what it writes into results/studies/<name>/ besides summary.json, by key; a
      name ending in "/" is a folder.
    - `threads`: 1, 2 (a fixed count, e.g. Spark's local[2]), "timed" (one process's cores, as
      a training run's: config `isolation`) or "processes" (its largest `processes`'s worth).
    - `gpus`: the GPUs it reserves: 0, 1 or "processes" (as many as its largest `processes`).
    - `timed`: it reserves its cores and GPUs while it runs (dmls/supervisor/slots.py).
    - `long`: among the longest jobs, started before any run (dmls/config/priority.py).
    - `environment`: its conda env, envs/<environment>.yaml.
    - `data`: the prepared data set it reads: a name, "config" (its config's `dataset`), or
      None.
    - `after`: studies whose table (their `table` output) it reads where they run.
    - `extension`: it loads C's CUDA extension, built by the `build_fused_conv_relu` rule.
    - `slurm_nodes`: under Slurm, its job spans the nodes its `-slurm` setups' srun steps use.
    - `a_runs_model`: its config gets the model and data set the A runs train
      (`gradient_model`: the gradient A5 explained reasons with is the one they all-reduce).
    """

    outputs: dict[str, str]
    threads: int | str = 1
    gpus: int | str = 0
    timed: bool = False
    long: bool = False
    environment: str = "pipeline"
    data: str | None = None
    after: tuple[str, ...] = ()
    extension: bool = False
    slurm_nodes: bool = False
    a_runs_model: bool = False


@dataclass(frozen=True)
class StudySpec:
    """One special study. `name` is its key in the config (`special_studies.<name>`), its
    folder (results/studies/<name>/) and its section's `special:` in report/studies.yaml.

    - `facts(summary, folder)`: the facts its answer's templates are filled from (report/
      studies.yaml, the section's `answer:`); raises NotMeasured with the reason where the
      study did not produce what the answer needs.
    - `tables`, `texts`, `downloads` (a glob in its folder): what its section shows beside the
      figures (every PNG of its folder); `text_tables`: its CSVs hold values as text ('nan',
      integers beyond 2^53), read as written; `shown_facts`: keys of its single row shown as a
      definition list (D3).
    - `repeats`: the config keys its provenance line counts, with their words.
    - `cases`: every case `facts` can return, each a template of its answer's entries.
    - `notes(summary)`: the sentences its section shows under its tables, written at render
      time from the summary's numbers (a measuring module writes numbers, never sentences).
    """

    name: str
    facts: Callable[[dict[str, Any], Path], Facts]
    tables: tuple[Table, ...] = ()
    texts: tuple[Text, ...] = ()
    downloads: str | None = None
    text_tables: bool = False
    shown_facts: tuple[str, ...] = ()
    repeats: tuple[tuple[str, str], ...] = (("repeats", "repeats"),)
    cases: tuple[str, ...] = ("measured",)
    notes: Callable[[dict[str, Any]], list[str]] | None = None

    def measure(self) -> Callable[..., dict[str, Any]]:
        """The function that runs the study, `run` of its folder's measure.py (imported here,
        with torch where it needs it)."""
        return pkgutil.resolve_name(f"dmls.special.{self.name}.measure:run")


def registry(*specs: StudySpec) -> dict[str, StudySpec]:
    """The studies by name; a name declared twice is an error."""
    found: dict[str, StudySpec] = {}
    for spec in specs:
        if spec.name in found:
            raise ValueError(f"special study {spec.name!r} is declared twice")
        found[spec.name] = spec
    return found
