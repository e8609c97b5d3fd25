"""Every file the pipeline writes, written atomically: a reader (Snakemake, the aggregator, a
resumed run, the report) never sees half a JSON, CSV or PNG file.

Importing this module is cheap (no matplotlib, no torch): the supervisor uses it too.
"""

from __future__ import annotations

import csv
import functools
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


@functools.cache
def schema_validator(schema_path: Path) -> Any:
    """A JSON Schema validator for the schema in `schema_path`, itself checked, built once."""
    import jsonschema

    schema = json.loads(schema_path.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def read_checked(
    path: Path, problems: Callable[[Any], list[str]], error: type[Exception], rebuild: str
) -> Any:
    """A JSON file that `problems` finds nothing wrong with; `error` otherwise, naming the file,
    what is wrong (the first three problems) and `rebuild`, the command that writes it again.
    The one way a record (dmls/record.py, dmls/summary.py) is read."""
    try:
        value = read_json(path)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise error(f"{path} is not valid JSON ({e}): cut short or changed; {rebuild}") from e
    if found := problems(value):
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        raise error(f"{path}: {'; '.join(found[:3])}{more}; {rebuild}")
    return value


def write_checked(
    path: Path, value: Any, problems: Callable[[Any], list[str]], error: type[Exception]
) -> None:
    """Write `value` atomically once `problems` finds nothing wrong with it as stored (NaN and
    infinities as null): a bug in a writer fails its job rather than a report later."""
    text = json_text(value)
    if found := problems(json.loads(text)):
        raise error(f"{path}: what is to be written breaks its schema: {'; '.join(found[:3])}")
    atomic_write(path, lambda f: f.write(text.encode()))


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
