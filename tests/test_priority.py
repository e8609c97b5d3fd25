"""Longest first (issue #41): the priorities Snakemake starts waiting jobs by."""

import math
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, make_spec
from dmls.config.priority import LONG_STUDY, UNKNOWN_SAMPLES, replays_graph, run_priority
from dmls.config.spec import load_schema

SCHEMA = load_schema()


def priority(**spec) -> int:
    return run_priority(make_spec(**spec), {}, SCHEMA)


def test_a_runs_priority_grows_with_its_samples_and_its_steps_slowness():
    graph = {"device": "cuda", "step": "graph", "seeds": 1, "epochs": 1, "train_samples": 1000}
    assert replays_graph(make_spec(**graph))
    assert priority(**graph) == 0  # 1 thousand samples: log2(1)
    assert priority(**graph | {"epochs": 16}) == 4 and priority(**graph | {"seeds": 4}) == 2
    # A step that replays no CUDA graph counts three times (log2 3 = 1.6, rounded up to 2).
    for slow in ({"step": "eager"}, {"loader": "torch"}, {"launcher": "dp"},
                 {"launcher": "accelerate"}, {"precision": "fp8"}, {"device": "cpu"}):  # fmt: skip
        assert not replays_graph(make_spec(**graph | slow)), slow
        assert priority(**graph | slow) == 2, slow
    # Every run stays below the special studies that hold a GPU for minutes.
    assert priority(**graph | {"seeds": 100, "epochs": 10**4, "train_samples": 10**9}) == (
        LONG_STUDY - 1
    )


def test_a_run_on_the_whole_data_counts_its_published_size_or_a_guess():
    whole = {"seeds": 1, "epochs": 1, "train_samples": 0, "device": "cuda", "step": "graph"}
    assert priority(**whole | {"dataset": "cifar10"}) == round(math.log2(50))
    assert UNKNOWN_SAMPLES == 10_000  # the user's own files: only reading them tells


def test_the_dags_long_poles_carry_their_priorities():
    """The four special studies that hold a GPU for minutes come first, then the slow runs."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), "-n", "--cores", "4", "--forceall"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    jobs = re.findall(r"^rule (\w+):\n(?:    .*\n)*?    priority: (\d+)", out.stdout, re.M)
    studies = {rule for rule, p in jobs if int(p) == LONG_STUDY}
    assert studies == {"fused_conv", "collectives", "sharding", "graphs"}
    runs = re.findall(r"run=(\w+)\n(?:    .*\n)*?    priority: (\d+)", out.stdout)
    by_run = {run: int(p) for run, p in runs}
    assert by_run["dataparallel_2gpu_dataloader"] > by_run["ddp_2gpu"]
    assert max(by_run.values()) < LONG_STUDY
