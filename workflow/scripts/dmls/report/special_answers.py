"""The special studies' answers to their questions: at most three sentences each, every figure
taken from the study's results/studies/<name>/ files (summary.json and its CSVs).

As for the training studies (dmls.report.answers), the words are templates in
report/studies.yaml, under a special section's `answer:`; each entry names the facts it is
filled from and has a template per case, or one for all:

    answer:
      - facts: spare_failure
        topic: failure with and without a spare
        say: "For {vector}, the job fails with probability {no_spare} without a spare ..."

A facts function reads one study's summary (and its folder, for the CSVs the summary does not
hold): `(summary, folder) -> (case, facts)`, the facts already written as text, or it raises
NotMeasured with the reason when the study did not produce what the answer needs (a failed or
skipped study, the rows the answer reads skipped on this host). A part that is missing while
the rest stands is written into its placeholder as "not measured here, as <why>", as
answers.py does for a comparison. Ratios of times follow one convention: the reference's time
over the other's (a speed), so > 1 means faster.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dmls.report import facts_memory, facts_speed, facts_systems
from dmls.report.answers import said_once
from dmls.report.comparisons import Facts, NotMeasured

# --------------------------------------------------------------------------- answers
# Facts an `answer:` entry of a special section names with `facts:`.
SPECIAL_FACTS: dict[str, Callable[[dict[str, Any], Path], Facts]] = {
    "profiler": facts_speed.profiler,
    "fused_conv": facts_speed.fused_conv,
    "lenet_memory": facts_memory.lenet_memory,
    "spare_failure": facts_systems.spare_failure,
    "float32_bytes": facts_memory.float32_bytes,
    "graphs": facts_speed.graphs,
    "collectives": facts_speed.collectives,
    "sharding": facts_memory.sharding,
    "serialization": facts_systems.serialization,
    "spark_lazy": facts_systems.spark_lazy,
}


def special_answer(entry: Any, summary: dict[str, Any], folder: Path) -> list[str]:
    """The sentences of a special section's `answer:` filled from its study's summary and
    folder. `entry` is the section (its `answer` list is filled), the list itself, or one
    entry. An entry names its facts (`facts:`), has a template per case (`say: {case: ...}`)
    or one for all (`say: "..."`), and an optional `topic`; where its facts are not measured,
    it says so: "Topic: not measured here, as <why>." A sentence equal to the one before it
    (several entries of a study that was not measured) is said once."""
    if isinstance(entry, dict) and "answer" in entry:
        entries = entry["answer"] or []
    elif isinstance(entry, dict):
        entries = [entry]
    else:
        entries = list(entry or [])
    summary = summary or {}  # (a study that did not run)
    computed: dict[str, Facts | NotMeasured] = {}
    sentences: list[str] = []
    for e in entries:
        text = _sentence(e, summary, Path(folder), computed)
        if not sentences or sentences[-1] != text:
            sentences.append(text)
    return said_once(sentences)


def _sentence(
    entry: dict[str, Any],
    summary: dict[str, Any],
    folder: Path,
    computed: dict[str, Facts | NotMeasured],
) -> str:
    name = entry["facts"]
    if name not in computed:
        try:
            computed[name] = SPECIAL_FACTS[name](summary, folder)
        except NotMeasured as e:
            computed[name] = e
    result = computed[name]
    if isinstance(result, NotMeasured):
        topic = entry.get("topic", name)
        return f"{topic[:1].upper()}{topic[1:]}: not measured here, as {result}."
    case, facts = result
    say = entry["say"]
    if isinstance(say, dict):
        if case not in say:
            raise KeyError(f"the answer of {name} has no template for case {case!r}")
        say = say[case]
    return say.format(**facts)
