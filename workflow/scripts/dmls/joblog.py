"""The log of one Snakemake job, as every `script:` entry point of the workflow opens it.

    with job_log(snakemake.log[0]) as log:
        main_from_snakemake(snakemake, log)

Until the job ends, the rule's log file receives sys.stderr (warnings, and whatever a library
prints there), Python's `logging` from INFO up (time, level, logger name) and an uncaught
exception with its traceback, which is then raised again for Snakemake to report. The open
file is yielded for lines written as they are: the supervisor streams its launchers' output
into it (dmls.supervisor.supervise.run).

A long job says it is alive in the terminal (`heartbeat`): every minute, its name, how long
it has run and the last line of its log (for a run, tqdm's bar of the epoch in progress).

Importing it is cheap (the standard library only): the supervisor uses it too.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
logger = logging.getLogger(__name__)


@contextlib.contextmanager
def job_log(path: str | Path) -> Iterator[IO[str]]:
    """Open the rule's log at `path` (truncated) and send the job's output there."""
    with open(path, "w") as log:
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter(FORMAT))
        root = logging.getLogger()
        level, stderr = root.level, sys.stderr
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        sys.stderr = log
        try:
            yield log
        except Exception:
            logger.exception("the job failed")
            raise
        finally:
            sys.stderr = stderr
            root.removeHandler(handler)
            root.setLevel(level)


def last_line(path: str | Path, tail_bytes: int = 4096) -> str:
    """The last line of the log at `path` that says something: what follows the last newline
    or carriage return (a progress bar redraws itself with one), blank lines skipped; empty
    where there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - tail_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.replace("\r", "\n").split("\n")]
    return next((line for line in reversed(lines) if line), "")


def heartbeat(name: str, log: IO[str], width: int = 160) -> Callable[[float], None] | None:
    """What a long job prints to the terminal while it runs (processes.start_and_wait calls
    it): "[12:03:41] parallelism/ddp_2gpu: running 3 min 0 s; epoch 3/15: 45%|... (log:
    results/runs/.../train.log)". To the terminal, not the log: sys.__stderr__, since the job
    sends sys.stderr to its log. None where `log` is no file (nothing to read back)."""
    path = getattr(log, "name", None)
    if not isinstance(path, str) or sys.__stderr__ is None:
        return None

    def beat(seconds: float) -> None:
        minutes, secs = divmod(int(seconds), 60)
        line = last_line(path)
        if len(line) > width:
            line = line[: width - 1] + "…"
        said = f"; {line}" if line else ""
        stamp = time.strftime("%H:%M:%S")
        print(
            f"[{stamp}] {name}: running {minutes} min {secs} s{said} (log: {path})",
            file=sys.__stderr__,
            flush=True,
        )

    return beat
