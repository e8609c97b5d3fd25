"""A special study's facts as parts, rendered twice: the whole answer and its brief.

A special study's declaration (dmls/special/<name>/spec.py) writes its answer's facts; most are
plain text, but two kinds of part render differently by where they are read:

- a `Figure` says a ratio with its interval and both means in the whole answer
  ('0.82× (0.75–0.89×; 3.17 vs 2.59 ms per step), slower') and without the means where the
  report shows it first ('0.82× (0.75–0.89×), slower'), as a run study's answer does
  (dmls.report.comparisons.Compared);
- a `Missing` part says why a part was not measured in full the first time its reason comes
  up in the answer, and "not measured here (as above)" after that.

Facts are composed with `+` and `join`, never with f-strings or `str.join`: a Phrase refuses
`format` and `str`, so a part can't be flattened into text that would then have to be patched
(the words render the parts; nothing parses a written sentence)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Figure:
    """A figure in full (with both means) and in brief (without them)."""

    full: str
    brief: str


@dataclass(frozen=True)
class Missing:
    """A part this folder lacks, and why."""

    why: str


Part = str | Figure | Missing


@dataclass(frozen=True)
class Phrase:
    """Text made of parts (`Part`), rendered by `render`."""

    parts: tuple[Part, ...] = field(default_factory=tuple)

    def __add__(self, other: str | Phrase) -> Phrase:
        return Phrase(self.parts + _parts(other))

    def __radd__(self, other: str) -> Phrase:
        return Phrase(_parts(other) + self.parts)

    def __format__(self, spec: str) -> str:
        raise TypeError("a Phrase is composed with + and phrases.join, and written by render")

    def __str__(self) -> str:
        raise TypeError("a Phrase is written by phrases.render, in full or in brief")


def _parts(value: str | Phrase) -> tuple[Part, ...]:
    return value.parts if isinstance(value, Phrase) else (value,)


def figure(full: str, brief: str) -> Phrase:
    return Phrase((Figure(full, brief),))


def missing(why: str) -> Phrase:
    """'not measured here, as <why>' (once per answer; later '… (as above)')."""
    return Phrase((Missing(why),))


def join(separator: str, items: Iterable[str | Phrase]) -> Phrase:
    """`separator.join(items)` for phrases."""
    parts: tuple[Part, ...] = ()
    for i, item in enumerate(items):
        parts += ((separator,) if i else ()) + _parts(item)
    return Phrase(parts)


def render(value: str | Phrase, brief: bool, said: set[str]) -> str:
    """`value` as text: its figures in brief or in full; a missing part's reason in full the
    first time it comes up (`said`, kept across one answer's sentences), 'as above' after."""
    out = []
    for part in _parts(value):
        if isinstance(part, Figure):
            out.append(part.brief if brief else part.full)
        elif isinstance(part, Missing):
            out.append(
                "not measured here (as above)"
                if part.why in said
                else f"not measured here, as {part.why}"
            )
            said.add(part.why)
        else:
            out.append(part)
    return "".join(out)


def full(value: str | Phrase) -> str:
    """`value` alone, in full (a fact read outside an answer: a table, a test)."""
    return render(value, False, set())
