"""The package's layers hold (workflow/scripts/dmls/__init__.py says which runs where): code
that runs outside the ranks imports no torch, the launcher is compared only where it must be,
and no module shadows the standard library."""

import json
import os
import re
import subprocess
import sys

from conftest import ROOT

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


def modules(folder: str = "") -> list[str]:
    return sorted(
        "dmls." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
        for p in (PACKAGE / folder).rglob("*.py")
        if p.name != "__init__.py"
    )


def test_what_runs_outside_the_ranks_imports_no_torch():
    torch_free = [*modules("config"), *modules("supervisor"), "dmls.files",
                  "dmls.training.faults", "dmls.training.worker"]  # fmt: skip
    code = (
        "import importlib, sys\n"
        f"for m in {torch_free!r}: importlib.import_module(m)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'accelerate', 'matplotlib', 'pandas'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=os.environ | {"PYTHONPATH": str(SCRIPTS)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "[]"
    assert "dmls.supervisor.supervise" in torch_free and "dmls.config.spec" in torch_free


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
    DAG: the config, the datasets' file layout, the captions and the Slurm resources
    (rules/common.smk); none of it torch or matplotlib, and the environment is not changed."""
    allowed = ("dmls.config", "dmls.data.datasets", "dmls.data.sources", "dmls.files",
               "dmls.report.captions", "dmls.supervisor.slurm")  # fmt: skip
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
    stray = [m for m in result["modules"] if m not in packages and not m.startswith(allowed)]
    assert stray == []


def test_no_module_shadows_the_standard_library():
    names = {p.stem for p in PACKAGE.rglob("*.py")} | {p.name for p in PACKAGE.rglob("*/")}
    assert names & set(sys.stdlib_module_names) == set()
