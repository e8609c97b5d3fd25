"""A cause is measured or not said. A sentence of the report that explains a result names the
measurement in this results folder that isolates the cause (a control run such as B1's
n1xp2_passive, a probe the record keeps, the collectives sweep, another study's run with the
same setting) and, where that leaves part of the effect, says how much stays unexplained.

Two places state causes: the answer templates of report/studies.yaml, and the sentences the
word modules build in code. A template whose words explain (`CAUSAL`) declares `measured_by:`,
the names of what measured it, each of which its words show the reader (`check_template`); in
code, such a sentence is a `Cause`, which can't be made without a measurement it names
(tests/test_causes.py also reads the word modules for explaining words outside one).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Words that explain: a sentence with one states a cause.
CAUSAL = re.compile(
    r"\b(because|due to|caused by|causes?|explains?|accounts? for|is why|the reason is|"
    r"comes? from the|is spent on|spinning on|measures that)\b",
    re.IGNORECASE,
)


class CauseError(ValueError):
    """A cause stated without a measurement that isolates it (names the sentence)."""


def _words(text: str) -> str:
    """A template's own words: its `{fields}`, filled from measurements, taken out."""
    return re.sub(r"\{[^{}]*\}", " ", text)


def explains(text: str) -> str | None:
    """The explaining word of `text`'s own words (`CAUSAL`), None where it has none."""
    found = CAUSAL.search(_words(text))
    return found.group(0) if found else None


@dataclass(frozen=True)
class Cause:
    """A sentence that explains, `measured_by` the measurements that isolate what it says (each
    named in `claim`, so the reader finds it in this report), and the share of the effect they
    leave unexplained (None: what they measured is the whole of it, or no share applies)."""

    claim: str
    measured_by: tuple[str, ...]
    unexplained: float | None = None

    def __post_init__(self) -> None:
        names = [m for m in self.measured_by if m.strip()]
        if not names:
            raise CauseError(f"a cause without a named measurement: {self.claim!r}")
        missing = [m for m in names if m.lower() not in self.claim.lower()]
        if missing:
            raise CauseError(
                f"a cause that does not name its measurement {', '.join(missing)} to the "
                f"reader: {self.claim!r}"
            )

    def __str__(self) -> str:
        if self.unexplained is None or self.unexplained <= 0.005:
            return self.claim
        return f"{self.claim}; {self.unexplained:.0%} of it stays unexplained here"


def cause(claim: str, *measured_by: str, unexplained: float | None = None) -> str:
    """`Cause` as its sentence: `claim`, which names each of `measured_by`."""
    return str(Cause(claim, measured_by, unexplained))


def _texts(say: Any) -> Iterable[str]:
    """A template's texts: one, or one per case."""
    if isinstance(say, str):
        yield say
    elif isinstance(say, dict):
        for text in say.values():
            yield from _texts(text)


def check_template(where: str, entry: dict[str, Any]) -> None:
    """An `answer:` entry of report/studies.yaml whose words explain (`explains`) names what
    measured it: `measured_by:`, a list of names, each shown in the template's words (or in
    every case's, for a template per case). Raises CauseError naming `where` otherwise."""
    texts = list(_texts(entry.get("say")))
    word = next((w for w in map(explains, texts) if w), None)
    if word is None:
        return
    names = entry.get("measured_by") or []
    if not names:
        raise CauseError(
            f"{where}: its template explains ({word!r}) but names no measurement that isolates "
            "the cause (measured_by: [the control run, probe or sweep, as its words name it])"
        )
    for text in texts:
        if explains(text):
            missing = [n for n in names if n.lower() not in _words(text).lower()]
            if missing:
                raise CauseError(
                    f"{where}: measured_by names {', '.join(missing)}, which its template's "
                    "words do not show the reader"
                )
