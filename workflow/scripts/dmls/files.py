"""Every file the pipeline writes, written atomically: a reader (Snakemake, the aggregator, a
resumed run, the report) never sees half a JSON, CSV or PNG file.

Importing this module is cheap (no matplotlib, no torch): the supervisor uses it too.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write through `write(file)` into a temporary sibling, fsync it, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary files
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_text(data: Any) -> str:
    """Strict JSON: NaN and infinities (a diverged run's losses) are written as null."""
    return json.dumps(_finite(data), indent=2, allow_nan=False, default=str) + "\n"


def write_json(path: Path, data: Any) -> None:
    text = json_text(data)
    atomic_write(path, lambda f: f.write(text.encode()))


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_csv(path: Path, rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> None:
    """One row per dict; `columns` fixes the order, and a key outside it is an error."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(Path(path), lambda f: f.write(buffer.getvalue().encode()))


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure of matplotlib's object API (no pyplot): no display, no global backend state."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def save_figure(fig: Figure, path: Path, dpi: int = 150) -> None:
    """`fig` as a PNG file."""
    atomic_write(Path(path), lambda f: fig.savefig(f, format="png", dpi=dpi))
