"""The files a special study writes besides its summary: CSV tables and PNG figures.

Written atomically like every other output, so a reader never sees half a table. Figures use
matplotlib's object API (`Figure`, no pyplot): no display and no global backend state needed.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from .io import atomic_write


def write_csv(path: Path, rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> None:
    """One row per dict; `columns` fixes the order, and a key outside it is an error."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(Path(path), lambda f: f.write(buffer.getvalue().encode()))


def new_figure(width_in: float, height_in: float) -> Figure:
    return Figure(figsize=(width_in, height_in), layout="constrained")


def save_figure(fig: Figure, path: Path) -> None:
    atomic_write(Path(path), lambda f: fig.savefig(f, format="png", dpi=150))
