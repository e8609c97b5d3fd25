"""A cause is measured or not said (dmls/report/causes.py): an answer template that explains
names what measured it, a sentence built in code that explains is a `Cause` with its
measurement, and no word module explains outside one."""

import ast
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from dmls.report import causes, quantities
from dmls.report.causes import Cause, CauseError, check_template, explains

REPORT = ROOT / "workflow" / "scripts" / "dmls" / "report"


def test_a_cause_without_a_named_measurement_fails():
    with pytest.raises(CauseError, match="without a named measurement"):
        Cause("the schedule alone makes the last epochs' loss fall", ())
    with pytest.raises(CauseError, match="does not name its measurement n1xp2_passive"):
        Cause("spinning threads cost 71% of the time lost", ("n1xp2_passive",))
    said = causes.cause("n1xp2_passive puts 71% of the time lost on spinning threads",
                        "n1xp2_passive", unexplained=0.18)  # fmt: skip
    assert said.endswith("; 18% of it stays unexplained here")


def test_a_cause_template_without_a_named_measurement_fails():
    planted = {"say": "A1 did not overfit because of the OneCycle schedule: {gap}."}
    with pytest.raises(CauseError, match=r"A2 answer 1: its template explains \('because'\)"):
        check_template("A2 answer 1", planted)
    with pytest.raises(CauseError, match="names none_run, which its template's words do not"):
        check_template("A2 answer 1", planted | {"measured_by": ["none_run"]})
    check_template("A2", {"say": "Because A4's none run, same schedule, overfit: {x}.",
                          "measured_by": ["A4's none run"]})  # fmt: skip
    # A field filled from a measurement is not the template's own words.
    check_template("D1", {"say": "Not measured here, as {why}."})
    assert explains("Why two processes are slower") is None  # (a question, not a cause)


def test_every_answer_template_names_what_measured_its_causes():
    sections = yaml.safe_load((ROOT / "report" / "studies.yaml").read_text())["sections"]
    checked = 0
    for section in sections:
        for i, entry in enumerate(section.get("answer") or []):
            check_template(f"{section.get('study') or section.get('special')} {i + 1}", entry)
            checked += bool(entry.get("measured_by"))
    assert checked >= 1  # (B1's one-host cause: n1xp2_passive and the collectives sweep)


def explaining_outside_a_cause(path: Path) -> list[str]:
    """String literals of a module (not docstrings) whose words explain, outside cause()."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skip.add(id(body[0].value))  # a docstring
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "cause":
            skip |= {id(sub) for sub in ast.walk(node)}
    return [
        f"{path.name}:{node.lineno} {explains(node.value)!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in skip and explains(node.value)
    ]  # fmt: skip


def test_no_word_module_explains_outside_a_cause(tmp_path):
    found = [f for name in quantities.WORD_MODULES
             for f in explaining_outside_a_cause(REPORT / f"{name}.py")]  # fmt: skip
    assert found == []
    planted = tmp_path / "observations.py"
    planted.write_text('def f():\n    return "A2 ends lower because of its schedule."\n')
    assert explaining_outside_a_cause(planted) == ["observations.py:2 'because'"]
