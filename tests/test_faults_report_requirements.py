"""`snakemake --report` works with what envs/requirements.txt installs, as the README sets it up.
Before: `WorkflowError: Python package pygments must be installed to create reports.` in a venv
made from envs/requirements.txt; the test venv (requirements-test.txt) has Pygments through
pytest, so the end-to-end report test could not see it.

What these tests prove: the packages of envs/requirements.txt and everything their installed
metadata says they require (evaluated here, in this venv: the same pins, constraints.txt) hold
every package Snakemake's report code says it needs, and `snakemake --report` builds a report
when every other installed package is hidden from it. What they don't: that pip resolves a
fresh install the same way (constraints.txt pins every version), nor another platform's
markers."""

import importlib.metadata as md
import json
import re
import subprocess
import sys
from pathlib import Path

import snakemake
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import ROOT

ENVS = ROOT / "envs"


def requirements(path: Path) -> list[Requirement]:
    """The requirements a pip requirements file names, its `-r` files' too (not `-c`)."""
    found = []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r"):
            found += requirements(path.parent / line[2:].strip())
        elif line and not line.startswith("-"):
            found.append(Requirement(line))
    return found


def installed_closure(wanted: list[Requirement]) -> set[str]:
    """The distributions `wanted` installs: each and, from the installed metadata, what it
    requires (with the extras asked for), recursively; canonical names."""
    extras: dict[str, set[str]] = {}
    todo = [(r.name, set(r.extras)) for r in wanted]
    while todo:
        name, asked = todo.pop()
        key = canonicalize_name(name)
        if key in extras and asked <= extras[key]:
            continue
        extras[key] = extras.get(key, set()) | asked
        for req in map(Requirement, md.requires(name) or []):
            markers = [{"extra": e} for e in extras[key] or {""}]
            if req.marker is None or any(req.marker.evaluate(m) for m in markers):
                todo.append((req.name, set(req.extras)))
    return set(extras)


def report_needs() -> set[str]:
    """What Snakemake's report code says it needs: the packages its 'must be installed to
    create reports' errors name, and its `reports` extra."""
    source = Path(snakemake.__file__).parent / "report"
    said = re.compile(r"Python package (\w+) must be installed to create reports")
    named = {m for p in source.rglob("*.py") for m in said.findall(p.read_text())}
    extra = [Requirement(r) for r in md.requires("snakemake") or []]
    named |= {r.name for r in extra if r.marker and r.marker.evaluate({"extra": "reports"})}
    return {canonicalize_name(n) for n in named}


def test_requirements_txt_installs_every_package_snakemakes_report_needs():
    needs = report_needs()
    assert "pygments" in needs  # what the reports extra and the error message name
    installed = installed_closure(requirements(ENVS / "requirements.txt"))
    assert needs - installed == set(), (
        f"snakemake --report needs {sorted(needs - installed)}, which envs/requirements.txt "
        "does not install"
    )
    # Each at the version constraints.txt pins (pip installs nothing unpinned from there).
    pinned = {canonicalize_name(r.name) for r in requirements(ENVS / "constraints.txt")}
    assert needs - pinned == set()


# Runs Snakemake with every installed package that envs/requirements.txt does not install
# hidden: an import of one fails as in a venv made from that file.
HIDDEN_RUN = """
import importlib.abc, importlib.metadata as md, json, sys
from packaging.utils import canonicalize_name
allowed = set(json.loads(sys.argv[1]))
providers = md.packages_distributions()

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        dists = providers.get(top)
        if dists and not any(canonicalize_name(d) in allowed for d in dists):
            raise ModuleNotFoundError(f"No module named {top!r}", name=top)
        return None

sys.meta_path.insert(0, Hide())
from snakemake.cli import main
main(sys.argv[2:])
"""


def test_snakemakes_report_builds_with_only_what_requirements_txt_installs(tmp_path):
    """The README's `snakemake --report`, on a DAG of one job (no study's outputs needed: what
    is checked is the report machinery, not the pipeline's figures)."""
    installed = installed_closure(requirements(ENVS / "requirements.txt"))
    results, page = tmp_path / "results", tmp_path / "snakemake-report.html"
    args = ["--report", str(page), "--config", f"results_dir={results}",
            "--", str(results / "data" / "tabular.json")]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", HIDDEN_RUN, json.dumps(sorted(installed)), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Report created." in out.stderr
    assert page.stat().st_size > 100_000


def test_the_hiding_works():
    """The same run with Pygments hidden too fails as the issue's venv did: the test above
    would have caught it."""
    installed = installed_closure(requirements(ENVS / "requirements.txt")) - {"pygments"}
    code = HIDDEN_RUN.replace("from snakemake.cli import main\nmain(sys.argv[2:])", "")
    code += "import pygments"
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(sorted(installed))],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1 and "No module named 'pygments'" in out.stderr
