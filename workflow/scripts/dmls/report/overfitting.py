"""A2's overfitting, read off a study's curves: which held-out loss the runs have, where each
run's mean curve had its minimum, and whether it overfit by the one rule over its seeds (each
seed's held-out loss rose after that minimum while its training loss fell, as 95% intervals
over the seeds); the table of those signs per run. answers.py (A2, A4's setting) and the
section's table read them here.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from dmls import stats
from dmls.report.study import Study
from dmls.report.wording import minus


def held_out_loss(histories: dict[str, pd.DataFrame]) -> tuple[str, str]:
    """The loss that tells overfitting, as (column, name): the validation split's where every
    run has one (model selection never reads the test set), else the test set's."""
    has_val = histories and all(
        "val_loss" in h and h["val_loss"].notna().all() for h in histories.values()
    )
    return ("val_loss", "validation loss") if has_val else ("test_loss", "test loss")


def held_out_minimum(
    study: Study, run: str, column: str
) -> tuple[pd.Series, pd.Series, bool, stats.Comparison | None]:
    """A run's epoch of minimum held-out loss (`column`) on its mean curve, its last epoch, and
    whether it overfit, by the one rule over its seeds: from that epoch to the last, each
    seed's held-out loss rose (the rises' 95% interval excludes 0, above) while its training
    loss fell (below). The minimum's epoch is read off the same seeds' mean, which favours a
    rise a little; one seed, or a minimum at the last epoch, tells none. Last: the rise over
    the seeds (stats.change; None where the minimum is the last epoch)."""
    history = study.histories[run]
    best, last = history.loc[history[column].idxmin()], history.iloc[-1]
    at = (int(best["epoch"]), int(last["epoch"]))
    if at[0] == at[1]:
        return best, last, False, None
    rise, fall = [], []
    for k in study.numbers[run].counted(column):
        rows = {r["epoch"]: r for r in study.metrics[run]["seeds"][k]["history"]}
        if all(e in rows and rows[e].get(column) is not None for e in at):
            rise.append(rows[at[1]][column] - rows[at[0]][column])
            fall.append(rows[at[1]]["train_loss"] - rows[at[0]]["train_loss"])
    rose, fell = stats.change(rise), stats.change(fall)
    overfit = (
        rose is not None
        and stats.finding(rose) == stats.MORE
        and fell is not None
        and stats.finding(fell) == stats.LESS
    )
    return best, last, overfit, rose


def generalization(study: Study) -> dict[str, Any] | None:
    """Overfitting signs per run (A2): final gaps, epoch of minimum held-out loss, and a flag
    where that loss rose after its minimum while train loss kept falling."""
    rows = []
    flagged = []
    histories = {run: h for run, h in study.histories.items() if len(h) >= 2}
    column, name = held_out_loss(histories)
    for run in histories:
        best, last, overfits, _ = held_out_minimum(study, run, column)
        if overfits:
            flagged.append(run)
        rows.append(
            [
                run,
                minus(f"{100 * (last['train_accuracy'] - last['test_accuracy']):.1f}"),
                f"{last['test_loss'] - last['train_loss']:.4f}",
                f"{int(best['epoch'])} of {int(last['epoch'])}",
                f"{best[column]:.4f} → {last[column]:.4f}",
                "yes" if overfits else "no",
            ]
        )
    if not rows:
        return None
    if flagged:
        summary = (
            f"The {name} rose after its minimum while train loss kept falling in: "
            f"{', '.join(flagged)} — the signature of overfitting."
        )
    else:
        summary = (
            f"No run shows its {name} rising after its minimum while train loss fell, beyond "
            "seed noise (each a 95% interval over the seeds)."
        )
    return {
        "columns": [
            "run",
            "Final gap, train − test acc. (points)",
            "Final gap, test − train loss",
            f"Epoch of min. {name}",
            f"{name[:1].upper()}{name[1:]}: min → final",
            "Overfitting flag",
        ],
        "rows": rows,
        "summary": summary,
    }
