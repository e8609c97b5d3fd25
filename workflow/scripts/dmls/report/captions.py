"""The captions of the study figures, from their one source, report/captions.yaml.

Both reports show them: the HTML report under each figure (dmls.report.page), Snakemake's own
report through report/figure.rst, which prints the `captions` param of rule report_study
(`for_snakemake_report`). Importing this module is cheap (no pandas, no matplotlib): Snakemake
imports it while it parses the workflow.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from markupsafe import Markup, escape

# report/captions.yaml of this checkout (the HTML report reads it beside its template).
CAPTIONS = Path(__file__).resolve().parents[4] / "report" / "captions.yaml"


def load(path: Path = CAPTIONS) -> dict[str, Any]:
    """The captions file: `figures` (kind -> text) and `overfitting` (A2's figure)."""
    return yaml.safe_load(Path(path).read_text())


def figure(captions: dict[str, Any], kind: str, quote: Callable[[Any], str], **values: Any) -> str:
    """The caption of a figure of this kind, its {placeholders} filled with `values`, each
    passed through `quote`; a kind without a caption is captioned with its name."""
    text = captions["figures"].get(kind)
    if text is None:
        return quote(kind)
    return text.format(**{name: quote(value) for name, value in values.items()})


def for_html(captions: dict[str, Any], kind: str, section: dict[str, Any]) -> Markup:
    """The caption of one figure of a study's section.json: the words as written, the study's
    names escaped."""
    return Markup(
        figure(
            captions,
            kind,
            escape,
            baseline=section["baseline"],
            compare_with=section["compare_with"],
        )
    )


def overfitting_for_html(captions: dict[str, Any], title: str) -> Markup:
    """The caption of A1's generalisation figure where section A2 shows it again."""
    return Markup(captions["overfitting"].format(title=escape(title)))


def _rst_literal(value: Any) -> str:
    return f"``{value}``"


def for_snakemake_report(
    captions: dict[str, Any], *, baseline: str, compare_with: str | None
) -> dict[str, str]:
    """Every figure kind's caption for one study, in reStructuredText (names as literals):
    the `captions` param of rule report_study, which report/figure.rst prints. A kind that
    needs a name the study lacks (`comparison` without compare_with) is left out: the study
    has no such figure."""
    values = {"baseline": baseline, "compare_with": compare_with}
    unset = [f"{{{name}}}" for name, value in values.items() if value is None]
    return {
        kind: figure(captions, kind, _rst_literal, **values)
        for kind, text in captions["figures"].items()
        if not any(placeholder in text for placeholder in unset)
    }
