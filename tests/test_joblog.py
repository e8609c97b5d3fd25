"""dmls.joblog: the one way every Snakemake entry point opens its job's log."""

import io
import logging
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT
from dmls.joblog import heartbeat, job_log, last_line

# A job as Snakemake runs a `script:`: a fresh interpreter, its own output, then a failure.
JOB = """
import logging, subprocess, sys, warnings
from dmls.joblog import job_log

with job_log(sys.argv[1]) as log:
    print("supervisor line", file=log, flush=True)
    subprocess.run([sys.executable, "-c", "print('launcher line')"], stdout=log, check=True)
    logging.getLogger("dmls.x").info("prepared %d", 3)
    logging.getLogger("dmls.x").debug("not shown")
    warnings.warn("careful", UserWarning, stacklevel=1)
    raise ValueError("bad spec")
"""


def test_the_log_gets_output_logging_warnings_and_the_traceback(tmp_path):
    path = tmp_path / "job.log"
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(JOB), str(path)],
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONPATH": str(ROOT / "workflow" / "scripts")},
    )
    assert out.returncode == 1 and out.stderr.rstrip().endswith("ValueError: bad spec")
    lines = path.read_text().splitlines()
    assert lines[:2] == ["supervisor line", "launcher line"]
    assert lines[2].endswith(" INFO dmls.x: prepared 3")
    assert lines[3].endswith("UserWarning: careful")
    assert lines[4].endswith(" ERROR dmls.joblog: the job failed")
    assert lines[5].startswith("Traceback") and lines[-1] == "ValueError: bad spec"
    assert "not shown" not in path.read_text()


def test_the_job_leaves_stderr_and_logging_as_they_were(tmp_path):
    stderr, level = sys.stderr, logging.getLogger().level
    with pytest.raises(KeyError), job_log(tmp_path / "job.log"):
        raise KeyError("x")
    assert sys.stderr is stderr and logging.getLogger().level == level
    logging.getLogger("dmls.x").warning("after the job")
    assert "after the job" not in (tmp_path / "job.log").read_text()


# A long job as Snakemake runs it: its launcher draws a progress bar into the job's log, and
# the supervisor waits with a heartbeat every 0.3 s.
LONG_JOB = """
import sys
from dmls.joblog import heartbeat, job_log
from dmls.supervisor import launch, processes

bar = (
    "import time\\n"
    "for i in range(1, 5):\\n"
    "    print(f'\\\\repoch 1/1: {25 * i}%', end='', flush=True)\\n"
    "    time.sleep(0.3)\\n"
)
with job_log(sys.argv[1]) as log:
    outcome = processes.start_and_wait(
        [launch.Command([sys.executable, "-c", bar], {})], log,
        heartbeat=heartbeat("study x", log), heartbeat_s=0.3,
    )
    assert outcome.ok
"""


def test_a_long_job_says_in_the_terminal_how_long_it_has_run_and_its_last_progress(tmp_path):
    """Issue #41: the terminal showed only job starts and ends (C ran 21 minutes silent). The
    heartbeat goes to the terminal, the log keeps only the job's own output."""
    path = tmp_path / "job.log"
    done = subprocess.run(
        [sys.executable, "-c", LONG_JOB, str(path)], capture_output=True, text=True,
        env=os.environ | {"PYTHONPATH": str(ROOT / "workflow" / "scripts")}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    beats = [line for line in done.stderr.splitlines() if "study x: running" in line]
    assert beats, done.stderr
    assert re.fullmatch(
        rf"\[\d\d:\d\d:\d\d\] study x: running 0 min 0 s; epoch 1/1: \d+% \(log: {path}\)",
        beats[0],
    )
    assert "running" not in path.read_text()


def test_the_last_line_of_a_log_is_what_its_progress_bar_drew_last(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("$ torchrun ...\nseed 1/3\n\repoch 2/15: 10%\repoch 2/15: 55%\n\n")
    assert last_line(path) == "epoch 2/15: 55%"
    assert last_line(tmp_path / "missing.log") == ""
    assert heartbeat("x", io.StringIO()) is None  # no file to read back
