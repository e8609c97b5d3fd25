"""dmls.joblog: the one way every Snakemake entry point opens its job's log."""

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT
from dmls.joblog import job_log

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
