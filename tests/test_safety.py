"""Nothing from config is evaluated or handed to a shell, and nothing unpickles code."""

import ast
import hashlib
import json
import os
import pickle
import re
from pathlib import Path

from conftest import ROOT

SOURCES = sorted((ROOT / "workflow" / "scripts").rglob("*.py"))
SNAKEFILES = [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]


# Calls that evaluate a string as code, hand it to a shell, or may unpickle code.
RUNS_CODE = {
    "eval", "exec", "compile", "__import__", "os.system", "os.popen",
    "pickle.load", "pickle.loads", "yaml.load", "yaml.unsafe_load",
}  # fmt: skip


def _name(node: ast.expr) -> str:
    """'torch.load' for the callee of torch.load(...)."""
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value.value if isinstance(kw.value, ast.Constant) else "<expr>"
    return None


def unsafe_calls(source: str) -> list[str]:
    """Calls that run strings as code, hand them to a shell, or unpickle arbitrary objects; and
    such a function handed on uncalled (`load = pickle.loads`), which calls it elsewhere."""
    found = []
    tree = ast.parse(source)
    callees = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    for node in ast.walk(tree):
        handed_on = isinstance(node, ast.Attribute | ast.Name) and id(node) not in callees
        if handed_on and (name := _name(node)) in RUNS_CODE:
            found.append(f"line {node.lineno}: {name}, handed on")
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        line = f"line {node.lineno}: {name}"
        if name in RUNS_CODE:
            found.append(line)
        elif name == "torch.load" and _keyword(node, "weights_only") is not True:
            found.append(f"{line} without weights_only=True")
        elif name == "np.load" and _keyword(node, "allow_pickle") is not False:
            found.append(f"{line} without allow_pickle=False")
        elif name.startswith("subprocess.") and _keyword(node, "shell") not in (None, False):
            found.append(f"{line} with shell=True")
    return found


def unquoted_shell_values(snakefile: str) -> list[str]:
    """`{...}` placeholders of `shell:` directives that Snakemake would not quote (`:q`)."""
    blocks = re.findall(r"^\s*shell:\s*\n((?:\s{8,}.*\n?)+)", snakefile, re.M)
    values = [re.findall(r"{[^{}]+}", b.replace("{{", "").replace("}}", "")) for b in blocks]
    return [value for found in values for value in found if not value.endswith(":q}")]


def test_the_checkers_catch_what_they_look_for():
    bad = (
        "import os, pickle, subprocess, torch, numpy as np\n"
        "eval(x); os.system(x); pickle.loads(b); subprocess.run(x, shell=True)\n"
        "torch.load(p); torch.load(p, weights_only=False); np.load(p)\n"
    )
    assert len(unsafe_calls(bad)) == 7
    assert unsafe_calls("import pickle\nload = pickle.loads\n") == [
        "line 2: pickle.loads, handed on"
    ]
    rule = 'rule r:\n    shell:\n        "train {params.spec} {output:q} {{literal}}"\n'
    assert unquoted_shell_values(rule) == ["{params.spec}"]


def problems(paths: list[Path], check) -> dict[str, list[str]]:
    return {str(p.relative_to(ROOT)): found for p in paths if (found := check(p.read_text()))}


# Deliberate, with the reason: D7 shows what unpickling does, on bytes it has just pickled
# itself (never a file), the payload's only effect an empty directory it removes again.
ALLOWED = {"workflow/scripts/dmls/special/serialization/measure.py": {"pickle.loads"}}


def test_pipeline_code_evaluates_nothing_and_uses_no_shell():
    assert ROOT / "workflow" / "scripts" / "dmls" / "supervisor" / "supervise.py" in SOURCES
    found = problems(SOURCES, unsafe_calls)
    allowed = {
        path: [f for f in lines if f.split(": ")[1].split(",")[0] not in ALLOWED.get(path, ())]
        for path, lines in found.items()
    }
    assert {path: lines for path, lines in allowed.items() if lines} == {}
    # What is allowed is used (an entry that no longer matches anything goes).
    assert {p: {f.split(": ")[1].split(",")[0] for f in found.get(p, [])} for p in ALLOWED} == (
        ALLOWED
    )


class RunsCode:
    """A pickle that would run a shell command when loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_whose_pickle_would_run_code_is_refused(tmp_path):
    """The header is right (identity, size, digest): only the unpickler stands between the
    file and the code, and it loads tensors and plain containers only."""
    from dmls.training import checkpoint

    marker = tmp_path / "ran"
    payload = pickle.dumps({"epoch": 1, "model": RunsCode(marker)})
    header = {"format": checkpoint.FORMAT_VERSION, "identity": {"run": "r"},
              "payload_sha256": hashlib.sha256(payload).hexdigest(),
              "payload_bytes": len(payload)}  # fmt: skip
    path = tmp_path / "c.pt"
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload)
    state, why = checkpoint.load(path, {"run": "r"})
    assert state is None and "is damaged (UnpicklingError" in why
    assert not marker.exists()


def test_no_rule_hands_a_value_to_a_shell():
    """Every rule runs a script (argument lists, never a shell line), so no config value is
    parsed by a shell; a rule with a `shell:` directive must quote every value it places."""
    assert all(p.exists() for p in SNAKEFILES) and len(SNAKEFILES) >= 5
    assert problems(SNAKEFILES, unquoted_shell_values) == {}
    shells = {
        str(p.relative_to(ROOT))
        for p in SNAKEFILES
        if re.search(r"^\s+shell:", p.read_text(), re.M)
    }
    assert shells == set()
