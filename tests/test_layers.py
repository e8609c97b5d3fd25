"""The package's layers hold (docs/architecture.md draws them): imports
point down the drawn floors and no modules import each other in a circle, code that runs
outside the ranks imports no torch, the launcher is compared only where it must be, and no
module shadows the standard library."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from dmls.special.jobs import NAMES

SCRIPTS = ROOT / "workflow" / "scripts"
PACKAGE = SCRIPTS / "dmls"
# Where a launcher's name may be compared: the spec (what the torch-free side needs) and the
# commands that start it; training/parallel.py maps it to its strategy class once.
LAUNCHER_PLACES = {"config/spec.py", "supervisor/launch.py"}
LAUNCHERS = r"[\"'](single|dp|torchrun|accelerate)[\"']"
LAUNCHER_COMPARED = re.compile(
    # spec.launcher ==, spec["launcher"] !=, spec.get("launcher") in
    rf"launcher[\"']?[\])]?\s*(==|!=|\bin\b)|(==|!=)\s*{LAUNCHERS}|{LAUNCHERS}\s*(==|!=)"
    r"|accelerator is (not )?None"
)


# The floors of the package, the lowest first. A module may import its own package's modules
# and any package on a lower floor; an import sideways (another package on its floor) or up is
# an error. training/ and report/ stand side by side: the report reads the record, never the
# training code.
FLOORS = (
    ("files", "stats", "joblog", "bytecode", "versions"),
    ("config", "protocol", "comm"),
    ("data", "record", "summary", "study_spec"),
    ("training", "report"),
    ("supervisor", "dag_outcome"),
    ("special",),
    ("hooks",),  # what the Snakefile's hooks do (rules/common.smk calls it)
)


def floor_of(part: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if part in floor)


def imports(package: Path) -> dict[str, set[str]]:
    """Each module of `package` (dotted, under `dmls`) and the dmls modules it imports,
    anywhere in its code (inside functions too; `from dmls.x import y` counts as dmls.x.y when
    y is a module)."""
    names = {
        ".".join(("dmls", *p.relative_to(package).with_suffix("").parts)).removesuffix(".__init__")
        for p in package.rglob("*.py")
    }
    found: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        module = ".".join(("dmls", *path.relative_to(package).with_suffix("").parts))
        module = module.removesuffix(".__init__")
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("dmls")}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dmls"):
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    targets.add(child if child in names else node.module)
        found[module] = targets - {module}
    return found


def climbing(package: Path) -> list[str]:
    """Every import of `package` that goes sideways or up the `FLOORS`."""
    wrong = []
    for module, targets in sorted(imports(package).items()):
        here = module.split(".")
        if len(here) == 1:
            continue  # dmls/__init__.py
        for target in sorted(targets):
            there = target.split(".")
            if len(there) == 1 or there[1] == here[1]:
                continue
            if floor_of(there[1]) >= floor_of(here[1]):
                wrong.append(f"{module} imports {target}")
    return wrong


def circles(package: Path) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (Tarjan)."""
    graph = imports(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in graph:
                continue  # a package's __init__ without code of its own
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_package_is_on_a_floor():
    parts = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in PACKAGE.glob("*")}
    parts -= {"__init__", "__pycache__", "metrics.schema.json", "summary.schema.json"}
    assert sorted(parts - {part for floor in FLOORS for part in floor}) == []


def test_imports_point_down_the_floors():
    assert climbing(PACKAGE) == []


def test_an_import_that_climbs_is_caught(tmp_path):
    """A planted upward import (training → supervisor) and a sideways one (report → training)
    fail the check; so do two modules that import each other."""
    copy = tmp_path / "dmls"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    models = copy / "training" / "models.py"
    models.write_text(models.read_text() + "\nfrom dmls.supervisor import launch  # planted\n")
    cells = copy / "report" / "cells.py"
    cells.write_text(cells.read_text() + "\n\ndef f():\n    import dmls.training.job\n")
    assert climbing(copy) == [
        "dmls.report.cells imports dmls.training.job",
        "dmls.training.models imports dmls.supervisor.launch",
    ]
    stats = copy / "stats.py"
    stats.write_text(stats.read_text() + "\nfrom dmls import files\n")
    files = copy / "files.py"
    files.write_text(files.read_text() + "\nfrom dmls import stats\n")
    assert ["dmls.files", "dmls.stats"] in circles(copy)


def word_modules(package: Path) -> list[str]:
    """The report's modules that write words (dmls/report/quantities.py's WORD_MODULES)."""
    tree = ast.parse((package / "report" / "quantities.py").read_text())
    found = next(
        node.value for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "WORD_MODULES"
    )  # fmt: skip
    return [f"dmls.report.{name}" for name in ast.literal_eval(found)]


def words_that_compute(package: Path) -> list[str]:
    """Every word module that imports dmls.stats or dmls.record itself, rather than reading the
    numbers layer (dmls.report.quantities)."""
    graph = imports(package)
    return [
        f"{module} imports {target}"
        for module in word_modules(package)
        for target in sorted(graph[module])
        if target in ("dmls.stats", "dmls.record") or target.startswith(("dmls.stats.",
                                                                           "dmls.record."))
    ]  # fmt: skip


def test_the_words_read_numbers_and_compute_none():
    """answers, observations, comparisons, wording ... render what dmls.report.quantities computed:
    none imports dmls.stats or dmls.record (a statistic computed in a sentence's module is how
    one ratio came to be computed three ways)."""
    assert len(word_modules(PACKAGE)) >= 8
    assert words_that_compute(PACKAGE) == []


def test_a_word_module_that_computes_is_caught(tmp_path):
    copy = tmp_path / "dmls"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    answers = copy / "report" / "answers.py"
    answers.write_text(answers.read_text() + "\n\ndef f():\n    from dmls.stats import ratio\n")
    wording = copy / "report" / "wording.py"
    wording.write_text(wording.read_text() + "\nfrom dmls import record  # planted\n")
    assert words_that_compute(copy) == [
        "dmls.report.answers imports dmls.stats",
        "dmls.report.wording imports dmls.record",
    ]


def test_no_modules_import_each_other_in_a_circle():
    assert circles(PACKAGE) == []


def modules(folder: str = "") -> list[str]:
    return sorted(
        "dmls." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
        for p in (PACKAGE / folder).rglob("*.py")
        if p.name != "__init__.py"
    )


def printed(code: str) -> str:
    """What `code` prints, run in a fresh interpreter with the package importable: what a
    process that imports only that loads."""
    return subprocess.run(
        [sys.executable, "-c", code], env=os.environ | {"PYTHONPATH": str(SCRIPTS)},
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def test_what_runs_outside_the_ranks_imports_no_torch():
    torch_free = [*modules("config"), *modules("supervisor"), "dmls.files",
                  "dmls.protocol", "dmls.training.faults", "dmls.training.worker"]  # fmt: skip
    code = (
        "import importlib, sys\n"
        f"for m in {torch_free!r}: importlib.import_module(m)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'accelerate', 'matplotlib', 'pandas'}))"
    )
    assert printed(code) == "[]"
    assert "dmls.supervisor.supervise" in torch_free and "dmls.config.spec" in torch_free


def test_a_ranks_imports_load_no_scipy():
    """Issue #41: scipy was 0.6 s of every rank's start on an H200 host (through dmls.record
    and dmls.stats); dmls.stats imports it when it computes an interval."""
    code = (
        "import sys; from dmls.training import job; from dmls import record, stats\n"
        "print('scipy' in sys.modules)"
    )
    assert printed(code) == "False"


def test_the_special_studies_declarations_import_no_study():
    """The report reads the special studies' declarations (dmls/special/catalog.py, handed over
    by its entry script); importing them loads no torch, no training code and no study's
    measuring module: those are imported only when a study runs (StudySpec.measure)."""
    code = (
        "import sys\n"
        "from dmls.special.catalog import STUDIES\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or "
        "m.startswith(('dmls.training', 'dmls.supervisor')) or "
        "m.startswith('dmls.special.') and not m.endswith(('.spec', '.catalog')) "
        "and m.count('.') > 2))"
    )
    assert printed(code) == "[]"


def test_the_launcher_is_compared_only_where_it_must_be():
    found = {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if any(
            LAUNCHER_COMPARED.search(line) and not line.lstrip().startswith("#")
            for line in p.read_text().splitlines()
        )
    }
    assert found == LAUNCHER_PLACES


def test_the_launcher_pattern_sees_every_way_of_comparing_it():
    for line in [
        'if spec.launcher == "dp":',
        'if spec["launcher"] == "dp":',
        "if spec['launcher'] != 'single':",
        'if metrics["spec"].get("launcher") in ("dp", "single"):',
        'if "torchrun" == kind:',
        "if kind != 'accelerate':",
    ]:
        assert LAUNCHER_COMPARED.search(line), line
    assert not LAUNCHER_COMPARED.search("launcher = spec.launcher")


def test_parsing_the_workflow_imports_no_torch_and_leaves_the_environment_as_it_was(tmp_path):
    """Snakemake's parse (and its dry run's input functions) imports only what declares the
    DAG: the config, the datasets' file layout, the captions, the Slurm resources and the
    count of this host's GPUs (rules/common.smk); none of it torch or matplotlib, and the
    environment is not changed."""
    allowed = ("dmls.config", "dmls.data.datasets", "dmls.data.sources", "dmls.files",
               "dmls.hooks", "dmls.report.captions", "dmls.supervisor.slurm",
               "dmls.supervisor.slots")  # fmt: skip
    code = f"""
import json, os, sys
from snakemake.cli import main
before = dict(os.environ)
try:
    main(["-n", "--cores", "1", "--quiet", "all", "--config", "results_dir={tmp_path}"])
except SystemExit as e:
    code = e.code
print(json.dumps({{"code": code, "changed": sorted(set(os.environ.items()) ^ set(before.items())),
                  "modules": sorted(m for m in sys.modules
                                    if m.split(".")[0] in ("dmls", "torch", "matplotlib"))}}))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, out.stderr[-2000:]
    assert result["changed"] == []
    packages = {"dmls", "dmls.config", "dmls.data", "dmls.report", "dmls.supervisor"}
    # The special studies' jobs (dmls/special/jobs.py), each declared in its folder's
    # __init__.py: their measuring code and their answers' declarations are not imported.
    packages |= {"dmls.special", "dmls.special.jobs", "dmls.study_spec"}
    packages |= {f"dmls.special.{name}" for name in NAMES}
    stray = [m for m in result["modules"] if m not in packages and not m.startswith(allowed)]
    assert stray == []


def test_no_module_shadows_the_standard_library():
    names = {p.stem for p in PACKAGE.rglob("*.py")} | {p.name for p in PACKAGE.rglob("*/")}
    assert names & set(sys.stdlib_module_names) == set()


# A module a reader can hold in mind, a function that fits on one screen.
MODULE_LINES = 600
FUNCTION_LINES = 80


def test_modules_and_functions_stay_readable():
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        text = path.read_text()
        if (lines := len(text.splitlines())) > MODULE_LINES:
            long_modules.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES:
                    long_functions.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    assert long_modules == []
    assert long_functions == []


def _is_table(node: ast.expr) -> bool:
    """A literal table: a tuple, list or set of three or more literals (or names, or tables),
    or a dict of three or more entries."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        items = (ast.Constant, ast.Name, ast.Attribute, ast.Starred, ast.UnaryOp)
        return len(node.elts) >= 3 and all(isinstance(e, items) or _is_table(e) for e in node.elts)
    return isinstance(node, ast.Dict) and len(node.keys) >= 3


def test_the_formatter_formats_all_but_tables():
    """`# fmt: skip` only on an assignment of a literal table (packed, it reads as a table; the
    formatter would put one item per line): everywhere else the formatter's layout."""
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        tables = {
            node.end_lineno
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
            and _is_table(node.value)
        }  # fmt: skip
        stray += [
            f"{path.relative_to(PACKAGE)}:{i}"
            for i, line in enumerate(text.splitlines(), 1)
            if line.endswith("# fmt: skip") and i not in tables
        ]
    assert stray == []
