"""What a special study is, declared once beside its module, as torchtitan's `TrainSpec` declares
a model family: where its measuring code lives, the facts its answer is filled from, the tables,
texts and downloads its report section shows, and what its provenance line counts.

A study `x` is measured by `dmls/special/x.py` (`run(cfg, out_dir, *, data_dir, threads)`) and
declared by `dmls/special/x_spec.py` (`SPEC`); `dmls/special/catalog.py` registers every SPEC.
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
class StudySpec:
    """One special study. `name` is its key in the config (`special_studies.<name>`), its
    folder (results/studies/<name>/) and its section's `special:` in report/studies.yaml.

    - `entry`: "module:function" that measures it, imported only when it runs.
    - `facts(summary, folder)`: the facts its answer's templates are filled from (report/
      studies.yaml, the section's `answer:`); raises NotMeasured with the reason where the
      study did not produce what the answer needs.
    - `tables`, `texts`, `downloads` (a glob in its folder): what its section shows beside the
      figures (every PNG of its folder); `text_tables`: its CSVs hold values as text ('nan',
      integers beyond 2^53), read as written; `shown_facts`: keys of its single row shown as a
      definition list (D3).
    - `repeats`: the config keys its provenance line counts, with their words.
    - `cases`: every case `facts` can return, each a template of its answer's entries.
    """

    name: str
    entry: str
    facts: Callable[[dict[str, Any], Path], Facts]
    tables: tuple[Table, ...] = ()
    texts: tuple[Text, ...] = ()
    downloads: str | None = None
    text_tables: bool = False
    shown_facts: tuple[str, ...] = ()
    repeats: tuple[tuple[str, str], ...] = (("repeats", "repeats"),)
    cases: tuple[str, ...] = ("measured",)

    def measure(self) -> Callable[..., dict[str, Any]]:
        """The function that runs the study (imported here, with torch where it needs it)."""
        return pkgutil.resolve_name(self.entry)


def registry(*specs: StudySpec) -> dict[str, StudySpec]:
    """The studies by name; a name declared twice is an error."""
    found: dict[str, StudySpec] = {}
    for spec in specs:
        if spec.name in found:
            raise ValueError(f"special study {spec.name!r} is declared twice")
        found[spec.name] = spec
    return found
