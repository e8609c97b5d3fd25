"""D2: the chance that a job on n machines fails, without and with one spare machine.

Machine i fails independently with probability p_i; the job needs all n.
- No spare: it fails when any machine fails, 1 - prod(1 - p_i).
- One always-working spare that replaces one failed machine: it fails when two or more fail,
  1 - prod(1 - p_i) - P(exactly one fails).
- The spare's reduction is P(exactly one fails) = sum_i p_i prod_{j != i} (1 - p_j)
  = prod_j (1 - p_j) * sum_i p_i / (1 - p_i), the course's form (needs every p_i < 1).
Monte Carlo draws every machine of every trial and counts failed machines per trial; each
estimate is a proportion, given with its Wilson score interval.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dmls import stats
from dmls.files import new_figure, save_figure, write_csv

log = logging.getLogger(__name__)

QUANTITIES = ("no_spare", "with_spare", "reduction")
# Uniform draws per Monte Carlo chunk: bounds memory (8 bytes each) whatever n and trials are.
CHUNK_DRAWS = 1 << 22
TABLE_COLUMNS = (
    "vector", "p", "n", "quantity", "closed_form", "monte_carlo", "ci_low", "ci_high",
    "within_ci", "trials", "confidence",
)  # fmt: skip


def _checked(p: Sequence[float]) -> np.ndarray:
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0 or not ((arr >= 0) & (arr < 1)).all():
        raise ValueError(f"failure probabilities must be a non-empty list in [0, 1), got {p!r}")
    return arr


def failure_counts(p: Sequence[float]) -> tuple[float, float, float]:
    """P(no machine fails), P(exactly one fails), P(two or more fail), by adding one machine at
    a time; only sums of non-negative terms, so no cancellation for small p_i."""
    none, one, more = 1.0, 0.0, 0.0
    for p_i in _checked(p):
        none, one, more = none * (1 - p_i), one * (1 - p_i) + none * p_i, more + one * p_i
    return none, one, more


def p_fail_no_spare(p: Sequence[float]) -> float:
    """1 - prod(1 - p_i), through log1p/expm1 so small p_i keep their digits."""
    return float(-np.expm1(np.log1p(-_checked(p)).sum()))


def p_exactly_one(p: Sequence[float]) -> float:
    """sum_i p_i prod_{j != i} (1 - p_j)."""
    return failure_counts(p)[1]


def spare_reduction(p: Sequence[float]) -> float:
    """The course's form of the spare's reduction: prod_j (1 - p_j) * sum_i p_i / (1 - p_i)."""
    arr = _checked(p)
    return float(np.prod(1 - arr) * (arr / (1 - arr)).sum())


def p_fail_with_spare(p: Sequence[float]) -> float:
    """Two or more machines fail: the spare covers only one."""
    return failure_counts(p)[2]


def closed_forms(p: Sequence[float]) -> dict[str, float]:
    return {
        "no_spare": p_fail_no_spare(p),
        "with_spare": p_fail_with_spare(p),
        "reduction": spare_reduction(p),
    }


def monte_carlo(
    p: Sequence[float], trials: int, confidence: float, rng: np.random.Generator
) -> dict[str, dict[str, float]]:
    """Simulate `trials` runs of n machines; per quantity the estimate and its interval."""
    arr = _checked(p)
    chunk = max(1, CHUNK_DRAWS // arr.size)
    any_failed = exactly_one = done = 0
    while done < trials:
        m = min(chunk, trials - done)
        failed = (rng.random((m, arr.size)) < arr).sum(axis=1)
        any_failed += int((failed >= 1).sum())
        exactly_one += int((failed == 1).sum())
        done += m
    counts = {
        "no_spare": any_failed,
        "with_spare": any_failed - exactly_one,
        "reduction": exactly_one,
    }
    out = {}
    for quantity, k in counts.items():
        low, high = stats.proportion_interval(k, trials, confidence)
        out[quantity] = {"estimate": k / trials, "ci_low": low, "ci_high": high}
    return out


def compare(
    name: str, p: Sequence[float], trials: int, confidence: float, rng: np.random.Generator
) -> list[dict[str, Any]]:
    """Closed forms against Monte Carlo for one vector: one row per quantity."""
    exact, simulated = closed_forms(p), monte_carlo(p, trials, confidence, rng)
    rows = []
    for quantity in QUANTITIES:
        mc = simulated[quantity]
        rows.append(
            {
                "vector": name,
                "p": " ".join(f"{v:g}" for v in p),
                "n": len(p),
                "quantity": quantity,
                "closed_form": exact[quantity],
                "monte_carlo": mc["estimate"],
                "ci_low": mc["ci_low"],
                "ci_high": mc["ci_high"],
                "within_ci": bool(mc["ci_low"] <= exact[quantity] <= mc["ci_high"]),
                "trials": trials,
                "confidence": confidence,
            }
        )
    return rows


def run(cfg: dict[str, Any], out_dir: Path, **_: Any) -> dict[str, Any]:
    rng = np.random.default_rng(cfg["seed"])
    trials, confidence = cfg["trials"], cfg["confidence"]
    vectors: list[dict[str, Any]] = []
    for name, p in cfg["p_vectors"].items():
        log.info("p vector %s (n=%d): %d trials", name, len(p), trials)
        vectors += compare(name, p, trials, confidence, rng)
    curve: list[dict[str, Any]] = []
    for p in cfg["curve_p"]:
        for n in cfg["curve_n"]:
            log.info("curve p=%g n=%d: %d trials", p, n, trials)
            curve += compare(f"p={p:g}", [p] * n, trials, confidence, rng)
    write_csv(out_dir / "vectors.csv", vectors, TABLE_COLUMNS)
    write_csv(out_dir / "curve.csv", curve, TABLE_COLUMNS)
    save_figure(_figure(curve, cfg["curve_p"]), out_dir / "failure_vs_n.png")
    rows = [{"status": "ok", "reason": None, **r} for r in vectors]
    misses = [r for r in vectors + curve if not r["within_ci"]]
    return {
        "rows": rows,
        "curve_points": len(curve),
        # With k comparisons at confidence c, about k·(1 - c) misses are expected by chance.
        "outside_ci": len(misses),
        "expected_outside_ci": (len(vectors) + len(curve)) * (1 - confidence),
    }


def _figure(curve: list[dict[str, Any]], curve_p: Sequence[float]):
    fig = new_figure(11, 4)
    axes = fig.subplots(1, 2)
    for p, colour in zip(curve_p, ("C0", "C1", "C2", "C3", "C4", "C5"), strict=False):
        label = f"p={p:g}"
        for ax, quantities in ((axes[0], ("no_spare", "with_spare")), (axes[1], ("reduction",))):
            for quantity in quantities:
                pts = [r for r in curve if r["vector"] == label and r["quantity"] == quantity]
                n = [r["n"] for r in pts]
                style = "--" if quantity == "with_spare" else "-"
                ax.plot(
                    n,
                    [r["closed_form"] for r in pts],
                    style,
                    color=colour,
                    label=f"{label}, {quantity.replace('_', ' ')}",
                )
                ax.errorbar(
                    n,
                    [r["monte_carlo"] for r in pts],
                    yerr=[
                        [r["monte_carlo"] - r["ci_low"] for r in pts],
                        [r["ci_high"] - r["monte_carlo"] for r in pts],
                    ],
                    fmt="o",
                    color=colour,
                    markersize=3,
                    capsize=2,
                )
    axes[0].set_title("P(job fails): lines closed form, dots Monte Carlo")
    axes[1].set_title("Reduction by one spare = P(exactly one fails)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("machines n (identical p)")
        ax.set_ylabel("probability")
        ax.legend(fontsize=7)
    return fig
