"""The package's layers hold (workflow/scripts/dmls/__init__.py says which runs where): code
that runs outside the ranks imports no torch, the launcher is compared only where it must be,
and no module shadows the standard library."""

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
LAUNCHER_COMPARED = re.compile(
    r"launcher\s*(==|!=|\bin\b)|\b(==|!=)\s*\"(single|dp|torchrun|accelerate)\""
    r"|\"(single|dp|torchrun|accelerate)\"\s*(==|!=)|accelerator is (not )?None"
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
    assert LAUNCHER_COMPARED.search('if spec.launcher == "dp":')  # the pattern sees one


def test_no_module_shadows_the_standard_library():
    names = {p.stem for p in PACKAGE.rglob("*.py")} | {p.name for p in PACKAGE.rglob("*/")}
    assert names & set(sys.stdlib_module_names) == set()
