"""The log of one Snakemake job, as every `script:` entry point of the workflow opens it.

    with job_log(snakemake.log[0]) as log:
        main_from_snakemake(snakemake, log)

Until the job ends, the rule's log file receives sys.stderr (warnings, and whatever a library
prints there), Python's `logging` from INFO up (time, level, logger name) and an uncaught
exception with its traceback, which is then raised again for Snakemake to report. The open
file is yielded for lines written as they are: the supervisor streams its launchers' output
into it (dmls.supervisor.supervise.run).

Importing it is cheap (the standard library only): the supervisor uses it too.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
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
