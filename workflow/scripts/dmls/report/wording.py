"""How the report's sentences write a compared number: its 95% interval, whether that holds
no effect (within seed noise), a minus sign, seconds (observations and communication)."""

from __future__ import annotations

from dmls import stats
from dmls.report.cells import seconds


def with_interval(text: str, comparison: stats.Comparison, interval: str) -> str:
    """A compared value with its 95% interval, saying so where the interval holds no effect."""
    if not comparison.has_interval:
        return text
    noise = ", within seed noise" if comparison.within_noise else ""
    return f"{text} (95% interval {interval}{noise})"


def ratio_text(ratio: stats.Comparison) -> str:
    """'1.62× (95% interval 1.55–1.70×)'."""
    value, interval = ratio_strings(ratio)
    return with_interval(value, ratio, interval)


def ratio_strings(ratio: stats.Comparison) -> tuple[str, str | None]:
    """A ratio and its interval as text ('1.62×', '1.55–1.70×'), with the decimals (2 to 4)
    that tell the interval's ends from the value: a narrow interval never reads
    "0.23× (95% interval 0.23–0.23×)". The interval is None without one."""
    digits = 2
    if ratio.has_interval:
        bounds = (ratio.low, ratio.value, ratio.high)
        while digits < 4 and len({f"{v:.{digits}f}" for v in bounds}) < 3:
            digits += 1
    interval = f"{ratio.low:.{digits}f}–{ratio.high:.{digits}f}×" if ratio.has_interval else None
    return f"{ratio.value:.{digits}f}×", interval


def points_text(difference: stats.Comparison) -> str:
    """A difference of accuracies in percentage points: '−0.9 points (95% interval −2.1 to
    +0.3, within seed noise)'."""
    interval = difference.has_interval and (
        f"{signed(100 * difference.low)} to {signed(100 * difference.high)}"
    )
    return with_interval(f"{signed(100 * difference.value)} points", difference, interval)


def signed(value: float) -> str:
    return minus(f"{value:+.1f}")


def minus(text: str) -> str:
    """Numbers as typeset: a minus sign, not a hyphen."""
    return text.replace("-", "−")


def in_s(value: float) -> str:
    """A duration in a sentence: "1.23 s"."""
    return f"{seconds(value)} s"
