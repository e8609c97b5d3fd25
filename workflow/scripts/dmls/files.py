"""Every file the pipeline writes, written atomically: a reader (Snakemake, the aggregator, a
resumed run, the report) never sees half a JSON, CSV or PNG file; a full disk names the file, its
size and the space left, and leaves what was there. And the one workflow that may write into a
results folder at a time (`claim_folder`).

Importing this module is cheap (no matplotlib, no torch): the supervisor uses it too.
"""

from __future__ import annotations

import csv
import datetime as dt
import errno
import fcntl
import functools
import io
import json
import math
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


# The errors of a file system that can't take more: the device is full, or the user's quota.
FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(OSError):
    """No space (or no quota) left writing a file: it names the file, the bytes it was to hold
    and the space left there; the file there before is unchanged. Nothing is wrong with the
    run: a rerun once there is space goes on (protocol.as_rank marks it `resumable`)."""

    resumable = True


def atomic_write(path: Path, write: Callable[[IO[bytes]], object], size: int | None = None) -> None:
    """Write through `write(file)` into a temporary sibling, fsync it, then rename over `path`.
    `size`: the bytes `write` writes, where the caller knows them (a full disk names them).
    On any error `path` is as it was and the temporary file is gone; a full disk (`FULL`)
    raises DiskFull."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        if e.errno in FULL:
            raise disk_full(path, e, size, written=0) from e
        raise
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary files
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        written = _size(tmp)
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in FULL:
            raise disk_full(path, e, size, written) from e
        raise


def disk_full(path: Path, error: OSError, size: int | None, written: int | None) -> DiskFull:
    """The DiskFull for `error` (ENOSPC, EDQUOT) writing `path`: the file, what it was to hold
    (`size` bytes, or what had reached the disk when it failed), the space left there."""
    what = "no space left on the device" if error.errno == errno.ENOSPC else "disk quota exceeded"
    if size is not None:
        held = f"{_bytes(size)} to write"
    elif written is not None:
        held = f"size unknown: it failed after {_bytes(written)}"
    else:
        held = "size unknown"
    try:
        free = f"{_bytes(shutil.disk_usage(_existing(path.parent)).free)} free there"
    except OSError as e:
        free = f"free space unknown: {e}"
    before = "the file there is as it was" if path.exists() else "no file was left there"
    return DiskFull(
        error.errno,
        f"{what} writing {path} ({held}; {free}): {before}; free space, then run the "
        "workflow again",
    )


def _bytes(n: int) -> str:
    return f"{n:,} bytes" if n < 2**20 else f"{n:,} bytes ({n / 2**20:,.1f} MiB)"


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _existing(folder: Path) -> Path:
    """`folder`, or its nearest ancestor that exists (the file system it would be on)."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def json_text(data: Any) -> str:
    """Strict JSON: NaN and infinities (a diverged run's losses) are written as null."""
    return json.dumps(_finite(data), indent=2, allow_nan=False, default=str) + "\n"


def write_json(path: Path, data: Any) -> None:
    text = json_text(data).encode()
    atomic_write(path, lambda f: f.write(text), size=len(text))


def read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


@functools.cache
def schema_validator(schema_path: Path) -> Any:
    """A JSON Schema validator for the schema in `schema_path`, itself checked, built once."""
    return validator_of(json.loads(schema_path.read_text()))


def validator_of(schema: dict[str, Any]) -> Any:
    """A JSON Schema validator for `schema`, itself checked."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def read_checked(
    path: Path,
    problems: Callable[[Any], list[str]],
    error: type[Exception],
    rebuild: str,
    upgrade: Callable[[Any], Any] | None = None,
) -> Any:
    """A JSON file that `problems` finds nothing wrong with; `error` otherwise, naming the file,
    what is wrong (the first three problems) and `rebuild`, the command that writes it again;
    `upgrade` first reads a file of an earlier version as the current one.
    The one way a record (dmls/record.py, dmls/summary.py) is read."""
    try:
        value = read_json(path)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise error(f"{path} is not valid JSON ({e}): cut short or changed; {rebuild}") from e
    if upgrade is not None:
        value = upgrade(value)
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
    data = text.encode()
    atomic_write(path, lambda f: f.write(data), size=len(data))


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
    data = buffer.getvalue().encode()
    atomic_write(Path(path), lambda f: f.write(data), size=len(data))


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure of matplotlib's object API (no pyplot): no display, no global backend state."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def save_figure(fig: Figure, path: Path, dpi: int = 150) -> None:
    """`fig` as a PNG file."""
    atomic_write(Path(path), lambda f: fig.savefig(f, format="png", dpi=dpi))


# --- One workflow per results folder --------------------------------------------------------

# In the results folder: held (flock) by the Snakemake that writes into it, and saying who that is.
WORKFLOW_LOCK = ".workflow.lock"


class FolderBusy(RuntimeError):
    """Another workflow (another clone, another Snakemake) is writing into the results folder."""


def claim_folder(folder: Path, checkout: str) -> IO[str]:
    """Hold `folder` for this process until the returned file is closed or the process ends:
    an exclusive flock on `<folder>/.workflow.lock`, which then says who holds it (pid, host,
    start, `checkout`: the holder's workflow). The kernel drops a flock with its process, so a
    workflow that was killed holds nothing. FolderBusy, naming the folder, its holder and what
    to do, where another process holds it; the lock file is then read, never changed.
    The file is not inherited by the processes this one starts (Python's default)."""
    folder = Path(folder).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / WORKFLOW_LOCK
    # Opened without truncating: what the holder wrote stays for the next workflow refused.
    lock = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o666), "r+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = lock.read()
        lock.close()
        if e.errno not in (errno.EAGAIN, errno.EACCES):
            raise OSError(
                e.errno,
                f"can't lock {path} ({e.strerror}): its file system may take no locks; give "
                "results_dir a folder on one that does (a local disk)",
            ) from e
        raise FolderBusy(_busy_message(folder, path, holder)) from None
    about = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "checkout": str(checkout),
        "command": " ".join(sys.argv),
    }
    lock.truncate(0)
    lock.write(json.dumps(about) + "\n")
    lock.flush()
    return lock


def _busy_message(folder: Path, path: Path, holder: str) -> str:
    try:
        about = json.loads(holder)
        who = (
            f"pid {about['pid']} on host {about['host']}, started {about['started']}, "
            f"workflow {about['checkout']}"
        )
    except (ValueError, TypeError, KeyError):
        who = f"which did not say who it is in {path}"
    return (
        f"results folder {folder} is in use by another workflow ({who}). This one stops before "
        "any job: nothing in the folder was changed. Let that workflow finish (or stop it), "
        "or give this one a folder of its own: --config results_dir=<another folder>. A "
        f"workflow that has ended holds nothing: its lock ({path}) goes with its process"
    )
