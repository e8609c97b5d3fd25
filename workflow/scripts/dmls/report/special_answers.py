"""The special studies' answers to their questions: at most three sentences each, every figure
taken from the study's results/studies/<name>/ files (summary.json and its CSVs).

As for the training studies (dmls.report.answers), the words are templates in
report/studies.yaml, under a special section's `answer:`; each entry has a template per case,
or one for all, and the topic a missing part is named by:

    answer:
      - topic: failure with and without a spare
        say: "For {vector}, the job fails with probability {no_spare} without a spare ..."

The study's declaration (dmls/special/<name>/spec.py, `StudySpec.facts`) reads its summary
(and its folder, for the CSVs the summary does not hold): `(summary, folder) -> (case, facts)`,
the facts already written as text, or it raises NotMeasured with the reason when the study did
not produce what the answer needs (a failed or skipped study, the rows the answer reads skipped
on this host). A part that is missing while the rest stands is written into its placeholder as
"not measured here, as <why>", as answers.py does for a comparison. Ratios of times follow one
convention: the reference's time over the other's (a speed), so > 1 means faster. The helpers
below are what those facts functions share.
"""

from __future__ import annotations

import csv
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dmls.report import quantities
from dmls.report.causes import check_template
from dmls.report.comparisons import NotMeasured, Ratio, short_reason
from dmls.report.phrases import Phrase, missing, render
from dmls.report.study import OK
from dmls.report.wording import DEVICES
from dmls.study_spec import Facts


def special_answer(
    entries: list[dict[str, Any]] | None,
    facts: Callable[[dict[str, Any], Path], Facts],
    summary: dict[str, Any] | None,
    folder: Path,
) -> tuple[list[str], list[str]]:
    """The sentences of a special section's `answer:` entries filled from `facts` (its study's
    declaration) of its summary and folder, computed once: the whole answer, and its brief (as
    the report shows it first: each ratio without its means). An entry has a template per case
    (`say: {case: ...}`) or one for all (`say: "..."`), and a `topic`; where the facts are not
    measured, it says so: "Topic: not measured here, as <why>.", each reason in full once. A
    sentence equal to the one before it (several entries of a study that was not measured) is
    said once."""
    try:
        result: Facts | NotMeasured = facts(summary or {}, Path(folder))
    except NotMeasured as e:
        result = e
    filled: list[str | Phrase] = []
    for i, entry in enumerate(entries or []):
        check_template(f"report/studies.yaml, a special study's answer {i + 1}", entry)
        text = _sentence(entry, result)
        if not filled or filled[-1] != text:
            filled.append(text)
    said: set[str] = set()
    full = [render(text, False, said) for text in filled]
    said.clear()
    return full, [render(text, True, said) for text in filled]


def _sentence(entry: dict[str, Any], result: Facts | NotMeasured) -> Phrase:
    if isinstance(result, NotMeasured):
        topic = entry["topic"]
        return f"{topic[:1].upper()}{topic[1:]}: " + missing(str(result)) + "."
    case, facts = result
    say = entry["say"]
    if isinstance(say, dict):
        if case not in say:
            raise KeyError(f"the answer about {entry['topic']} has no template for case {case!r}")
        say = say[case]
    return fill(say, facts)


def fill(template: str, facts: dict[str, str | Phrase]) -> Phrase:
    """`template.format(**facts)` where a fact may be a phrase: the template's literal text and
    each field's value, in order (a field names a fact; no format spec)."""
    out = Phrase()
    for literal, name, spec, conversion in string.Formatter().parse(template):
        out += literal
        if name is not None:
            if spec or conversion:
                raise ValueError(f"the template field {{{name}}} takes no format: {template!r}")
            out += facts[name] if isinstance(facts[name], Phrase) else str(facts[name])
    return out


# --- What a study's facts read from its summary (dmls/special/*/spec.py) ----------------


def not_measured(why: str) -> Phrase:
    """A placeholder for a part this folder lacks: 'not measured here, as <why>', the reason
    in full the first time the answer gives it."""
    return missing(why)


def finished_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary's rows; NotMeasured when the study produced none, or skipped all of them."""
    rows = summary.get("rows") or []
    if not rows:
        raise NotMeasured("the study wrote no results")
    if not any(r.get("status") == OK for r in rows):
        raise NotMeasured(skip_reason(rows))
    return rows


def skip_reason(rows: list[dict[str, Any]]) -> str:
    """Why a part did not run, from the first of `rows` that is not ok: "it was skipped: no
    CUDA device on this host", "it failed: ..."."""
    bad = next((r for r in rows if r.get("status") != OK), None)
    if bad is None:
        return "the config does not measure it"
    why = short_reason(bad.get("reason")) or "no reason was given"
    return f"it {status_verb(bad.get('status'))}: {why}"


def status_verb(status: Any, plural: bool = False) -> str:
    """A row's status as a verb: 'failed', 'was skipped' ('were skipped')."""
    return "failed" if status == "failed" else f"{'were' if plural else 'was'} {status}"


def read_csv_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def speed(reference: list[float], other: list[float], means: str, paired: bool = False) -> Phrase:
    """`other` against `reference` as a speed, the reference's time over the other's (the ratio
    of their geometric means), with its 95% interval over the repeats where both have two or
    more, the two means (`means`, as written) and a verdict:
    '0.82× (0.75–0.89×; 3.17 ± 0.278 vs 2.59 ± 0.137 ms), slower'. `paired`: the two were timed
    taking turns, repeat k of each beside the other's, so the ratio is taken repeat by repeat
    (stats.paired_ratio), and a drift both shared cancels."""
    ratio = quantities.ratio_of_repeats(reference, other, paired)
    return Ratio.of(ratio, means, "repeat").phrase("faster", "slower")


def elsewhere(others: list[dict[str, Any]], what: str = "") -> str:
    """Why the rows of another device (or `what`) are missing, where they are: " (the GPU's
    rows were skipped: no CUDA device on this host)"; empty where none is missing."""
    bad = next((r for r in others if r.get("status") != OK), None)
    if bad is None:
        return ""
    what = what or f"{DEVICES.get(bad['device'], bad['device'])}'s rows"
    return f" ({what} {status_verb(bad['status'], plural=True)}: {bad.get('reason')})"
