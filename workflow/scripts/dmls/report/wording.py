"""How the report's sentences write a compared number: its 95% interval with the decimals that
show which side of the null it lies on, its verdict (dmls.stats.verdict, the one rule), a minus
sign, seconds (observations and communication)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dmls.report.cells import seconds
from dmls.report.quantities import MORE, NO_EFFECT, Comparison


def no_range(comparison: Comparison, unit: str = "seed") -> str | None:
    """Why a comparison prints no interval as a range: a side with one `unit`, or each side's
    values the same to the last digit (an interval of zero width); None where it has a range."""
    if not comparison.has_interval:
        return "no interval" if comparison.untold else f"one {unit} on a side, no interval"
    if comparison.identical:
        return f"the same in every {unit}"
    if comparison.low == comparison.high:
        return f"no spread in the {unit}s compared"
    return None


def with_interval(
    text: str, comparison: Comparison, interval: str | None, verdict: str, unit: str = "seed"
) -> str:
    """A compared value with its 95% interval and its verdict (stats.verdict): '1.62× (95%
    interval 1.55–1.70×), faster'; without an interval, the value and the verdict alone; with
    one of zero width (each side the same in every `unit`), that in words (`no_range`)."""
    if not comparison.has_interval:
        return f"{text}, {verdict}"
    if why := no_range(comparison, unit):
        return f"{text} ({why}), {verdict}"
    return f"{text} (95% interval {interval}), {verdict}"


def inside(comparison: Comparison, interval: str | None, means: str, unit: str) -> str:
    """What an answer's figure holds in its brackets: 'the interval; both means', or 'both
    means; why there is no range' (`no_range`)."""
    why = no_range(comparison, unit)
    return f"{means}; {why}" if why else f"{interval}; {means}"


def ratio_text(ratio: Comparison, more: str, less: str, unit: str = "seed") -> str:
    """'1.62× (95% interval 1.55–1.70×), faster': `more` and `less` are the verdict's words."""
    value, interval = ratio_strings(ratio)
    verdict = ratio.verdict(more, less, unit)
    return with_interval(value, ratio, interval, verdict, unit)


def _digits(comparison: Comparison, scale: float, digits: int, most: int) -> int:
    """The decimals (from `digits` up to `most`) at which the interval's ends read apart from
    the value and on the side of the null the verdict says: an interval that excludes the null
    never prints the null as its end ("+0.1 (+0.0 to +0.2), more accurate" reads "+0.12 (+0.04
    to +0.21)"), a finding's value never reads as the null ("1.00×, faster"), nor a narrow
    interval "0.23× (0.23–0.23×)"; an interval that holds the null prints an end as the null
    only where it is ("−1.0 to 0.0, within seed noise" reads "−0.98 to +0.01")."""
    if not comparison.has_interval:
        return digits
    assert comparison.low is not None and comparison.high is not None  # has_interval
    way = comparison.finding
    null = comparison.null * scale
    while digits < most:
        low, value, high = (
            round(v * scale, digits) for v in (comparison.low, comparison.value, comparison.high)
        )
        apart = comparison.low == comparison.high or len({low, value, high}) == 3
        if way == NO_EFFECT:  # an end reads as the null only where it is the null
            sided = all(
                end != null or exact * scale == null
                for end, exact in ((low, comparison.low), (high, comparison.high))
            )
        else:
            sided = value != null and (low > null if way == MORE else high < null)
        if apart and sided:
            break
        digits += 1
    return digits


def ratio_strings(ratio: Comparison) -> tuple[str, str | None]:
    """A ratio and its interval as text ('1.62×', '1.55–1.70×'), with the decimals (2 to 4)
    that tell the interval's ends from the value and the null (`_digits`). The interval is
    None without one."""
    digits = _digits(ratio, 1.0, 2, 4)
    interval = f"{ratio.low:.{digits}f}–{ratio.high:.{digits}f}×" if ratio.has_interval else None
    return f"{ratio.value:.{digits}f}×", interval


def points_strings(difference: Comparison) -> tuple[str, str | None]:
    """A difference of fractions in percentage points and its interval ('−0.9 points', '−2.1
    to +0.3'), with the decimals (1 to 3) that tell the ends from the value and from zero."""
    digits = _digits(difference, 100.0, 1, 3)
    value = f"{signed(100 * difference.value, digits)} points"
    if not difference.has_interval:
        return value, None
    assert difference.low is not None and difference.high is not None  # has_interval
    return (
        value,
        f"{signed(100 * difference.low, digits)} to {signed(100 * difference.high, digits)}",
    )


def points_text(
    difference: Comparison, more: str = "more accurate", less: str = "less accurate"
) -> str:
    """A difference of accuracies in percentage points: '−0.9 points (95% interval −2.1 to
    +0.3), within seed noise'."""
    value, interval = points_strings(difference)
    return with_interval(value, difference, interval, difference.verdict(more, less))


def signed(value: float, digits: int = 1) -> str:
    """'+1.2', '−0.4'; a value that rounds to zero has no sign ('0.0', not '−0.0')."""
    text = f"{value:+.{digits}f}"
    return text[1:] if float(text) == 0 else minus(text)


def minus(text: str) -> str:
    """Numbers as typeset: a minus sign, not a hyphen."""
    return text.replace("-", "−")


def in_s(value: float) -> str:
    """A duration in a sentence: "1.23 s"."""
    return f"{seconds(value)} s"


# Numbers in the special studies' answers (dmls/report/special_answers.py).
# Two byte counts (or bytes per parameter) agree when they differ by at most this fraction.
AGREE = 0.01
# How a device is named in a sentence.
DEVICES = {"cuda": "the GPU", "cpu": "the CPU"}


def fmt_count(n: float) -> str:
    return f"{n:,.0f}"


def fmt_bytes(n: float) -> str:
    """'1,487,328 bytes (1.42 MiB)'."""
    return f"{n:,.0f} bytes ({fmt_size(n)})"


def fmt_size(n: float) -> str:
    """A message size in binary units, three significant digits: '4 B', '2.37 MiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_percent(fraction: float, decimals: int = 1) -> str:
    return f"{100 * fraction:.{decimals}f}%"


def fmt_sig(x: float, digits: int = 4) -> str:
    return minus(f"{x:.{digits}g}")


def fmt_num(x: float) -> str:
    """Three significant digits, in positional notation: '0.247', '68.7', '1,600'."""
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return minus(
        np.format_float_positional(x, precision=3, unique=False, fractional=False, trim="-")
    )


def fmt_mean(row: dict[str, Any], mean: str, ci95: str) -> str:
    """A row's mean with the half-width of its 95% interval where it has one, the half-width
    to two significant digits and the mean to the same decimal place: '3.17 ± 0.28',
    '15.000 ± 0.027' (not '15 ± 0.0274')."""
    value, half = float(row[mean]), row.get(ci95)
    if half is None or half == "" or not math.isfinite(float(half)):
        return fmt_num(value)
    if float(half) <= 0:
        return f"{fmt_num(value)} ± 0"
    decimals = max(0, 1 - math.floor(math.log10(float(half))))
    return minus(f"{value:,.{decimals}f} ± {float(half):,.{decimals}f}")


def fmt_plural(n: Any, word: str) -> str:
    return f"{n} {word}" if str(n) == "1" else f"{n} {word}s"


def closeness(measured: float, reference: float) -> str:
    """'agrees' within AGREE, else 'X% above' / 'X% below' (relative to `reference`)."""
    off = measured / reference - 1
    if abs(off) <= AGREE:
        return "agrees"
    return f"{fmt_percent(abs(off))} {'above' if off > 0 else 'below'}"
