"""dmls.summary: the special studies' summary.json has a schema and one owner that writes and
reads it; a summary that breaks it is named, with what is wrong and how to rebuild it."""

import ast
import copy
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import ROOT
from dmls import summary
from dmls.files import write_json
from dmls.special import runner

SPECIAL = ROOT / "workflow" / "scripts" / "dmls" / "special"


def schema() -> dict:
    """summary.schema.json with each study's own keys (dmls/special/<name>/summary.schema.json)."""
    return summary.schema()


def payload_keys() -> dict[str, set[str]]:
    """Per study the schema knows, the keys of its payload (its `run`'s besides rows)."""
    found = {}
    for rule in schema()["allOf"]:
        study = rule["if"]["properties"]["study"].get("const")
        if study is None:
            continue
        names = rule["then"]["propertyNames"]
        found[study] = {k for option in names.get("anyOf", []) for k in option.get("enum", [])}
    return found


def valid(study: str = "graphs") -> dict:
    """A summary as run_study writes it: two ok rows and a skipped one, graphs' payload."""
    rows = [
        {"device": "cpu", "mode": "eager", "status": "ok", "reason": None},
        {"device": "cpu", "mode": "graph", "status": "ok", "reason": None},
        {"device": "cuda", "mode": "graph", "status": "skipped", "reason": "no CUDA device"},
    ]
    control = [{"model": "branchy", "capture": "torch.compile", "outcome": "graph break"}]
    return summary.new(
        study,
        "D5. Graphs",
        {"rows": rows, "control_flow": control},
        config={"title": "D5. Graphs", "enabled": True},
        host={"hostname": "h", "gpus": [], "torch": "2.14"},
        threads=2,
        started_at="2026-11-28T22:10:15+00:00",
        wall_time_s=1.5,
    )


def test_a_summary_as_the_runner_builds_it_is_valid():
    s = valid()
    assert summary.problems(s) == []
    assert s["status"] == "ok" and s["counts"] == {"ok": 2, "skipped": 1}
    assert s["summary_version"] == summary.SUMMARY_VERSION
    version = summary.schema()["properties"]["summary_version"]["const"]
    assert version == summary.SUMMARY_VERSION  # the schema's and the code's, bumped together


@pytest.mark.parametrize(
    ("statuses", "overall"),
    [(["ok", "ok"], "ok"), (["ok", "skipped"], "ok"), (["skipped"], "skipped"),
     (["ok", "failed", "skipped"], "failed")],
)  # fmt: skip
def test_the_overall_status_is_the_rows(statuses, overall):
    assert summary.overall_status([{"status": s} for s in statuses]) == overall


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda s: s.pop("host"), "(top): 'host' is a required property"),
        (lambda s: s.pop("control_flow"), "(top): 'control_flow' is a required property"),
        (
            lambda s: s.update(extra=1),
            "(top): Additional properties are not allowed ('extra' was unexpected)",
        ),
        # profiler's key in graphs' summary: declared, but not graphs'.
        (
            lambda s: s.update(verdicts={}),
            "(top): 'verdicts' belongs to another study's summary, not graphs",
        ),
        (
            lambda s: s["rows"][1].update(status="done"),
            "rows/1/status: 'done' is not one of ['ok', 'skipped', 'failed']",
        ),
        (lambda s: s["rows"][2].pop("reason"), "rows/2: 'reason' is a required property"),
        (lambda s: s["counts"].update(ok=-1), "counts/ok: -1 is less than the minimum of 0"),
        (lambda s: s.update(status="fine"), "status: 'fine' is not one of"),
        (lambda s: s.update(threads=0), "threads: 0 is less than the minimum of 1"),
        # What the schema can't say: the counts and the status are the rows'.
        (
            lambda s: s["counts"].update(ok=3),
            "counts: {'ok': 3, 'skipped': 1}, but the rows have {'ok': 2, 'skipped': 1}",
        ),
        (lambda s: s.update(status="failed"), "status: 'failed', but the rows make it 'ok'"),
        (lambda s: s.update(summary_version=3), "summary version 3, this pipeline reads 2"),
    ],
)
def test_a_summary_that_breaks_the_schema_says_where(change, problem):
    s = valid()
    change(s)
    found = summary.problems(s)
    assert len(found) == 1 and found[0].startswith(problem), found


def test_a_study_the_schema_does_not_know_has_no_payload():
    s = valid("fake")
    assert summary.problems(s) == [
        "(top): 'control_flow' belongs to another study's summary, not fake",
    ]
    s.pop("control_flow")
    assert summary.problems(s) == []


def test_a_summary_of_version_1_is_read_without_the_sentences_it_wrote(tmp_path):
    """Version 1 held "notes", sentences D1, D4, D5 and A5 wrote as they measured (D1's said
    a direction whatever was measured); the report now writes them from the rows, so a results
    folder of that version is read, its numbers kept, and its sentences dropped."""
    old = valid() | {"summary_version": 1, "notes": ["The measured activations are below."]}
    path = tmp_path / "graphs" / "summary.json"
    path.parent.mkdir()
    path.write_text(json.dumps(old))
    read = summary.read(path)
    assert read == valid() and "notes" not in read


def test_read_names_a_broken_file_and_how_to_rebuild_it(tmp_path):
    path = tmp_path / "graphs" / "summary.json"
    write_json(path, valid())
    assert summary.read(path)["study"] == "graphs"
    text = path.read_text()
    path.write_text(text[:100])
    with pytest.raises(summary.SummaryError) as err:
        summary.read(path)
    assert str(err.value).startswith(f"{path} is not valid JSON (")
    assert str(err.value).endswith(
        f"cut short or changed; rebuild that study: snakemake --forcerun {path}"
    )
    broken = valid()
    broken["rows"][0]["status"] = "done"
    write_json(path, broken)
    with pytest.raises(summary.SummaryError) as err:
        summary.read(path)
    assert str(err.value) == (
        f"{path}: rows/0/status: 'done' is not one of ['ok', 'skipped', 'failed']; "
        f"rebuild that study: snakemake --forcerun {path}"
    )


def test_write_refuses_a_broken_summary_and_leaves_no_file(tmp_path):
    broken = valid()
    broken["counts"]["ok"] = -1
    with pytest.raises(summary.SummaryError, match="breaks its schema: counts/ok: -1"):
        summary.write(tmp_path / "summary.json", broken)
    assert not (tmp_path / "summary.json").exists()


def test_run_study_writes_through_the_owner(tmp_path, monkeypatch):
    def study(cfg, out_dir, **_):
        return {"rows": [{"status": "ok", "reason": None}], "undeclared": 1}

    monkeypatch.setitem(runner.STUDIES, "fake", SimpleNamespace(measure=lambda: study))
    with pytest.raises(summary.SummaryError, match="'undeclared' was unexpected"):
        runner.run_study("fake", {"title": "T"}, tmp_path)
    assert not (tmp_path / "summary.json").exists()
    empty = SimpleNamespace(measure=lambda: lambda cfg, out_dir, **_: {"rows": []})
    monkeypatch.setitem(runner.STUDIES, "fake", empty)
    written = runner.run_study("fake", {"title": "T"}, tmp_path)
    assert summary.read(tmp_path / "summary.json") == json.loads(json.dumps(written))


def test_the_schema_knows_every_study_and_what_its_run_returns():
    """Every study of the runner has its payload declared, and every key a study's `run`
    returns by name (a ** of a dict built elsewhere aside) is one of them."""
    declared = payload_keys()
    assert set(declared) == set(runner.STUDIES)
    properties = schema()["properties"]
    assert set().union(*declared.values()) <= set(properties)
    for name in runner.STUDIES:
        source = (SPECIAL / name / "measure.py").read_text()
        run = next(
            n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "run"
        )
        returned = {
            key.value
            for node in ast.walk(run)
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict)
            for key in node.value.keys
            if isinstance(key, ast.Constant)
        }
        assert "rows" in returned, name
        frame = set(schema()["$defs"]["frame_key"]["enum"])
        assert returned - {"rows"} - frame <= declared[name], name


def test_every_declared_key_says_what_it_is():
    s = schema()
    assert s["additionalProperties"] is False
    # The frame every summary carries, and the frame keys a study may lack (`reserved`: the
    # GPUs and cores of a timed study's job; `load_average_before`, absent from a summary
    # written before it was recorded).
    frame = list(s["$defs"]["frame_key"]["enum"])
    optional = {"reserved", "load_average_before"}
    assert s["required"] == [k for k in frame if k not in optional] and optional < set(frame)
    undescribed = [k for k, v in s["properties"].items() if not v.get("description")]
    assert undescribed == []


def test_the_owner_imports_neither_torch_nor_pandas():
    code = (
        "import sys; import dmls.summary\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'pandas'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=os.environ | {"PYTHONPATH": str(ROOT / "workflow" / "scripts")},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "[]"


def test_the_timeline_reads_the_summaries_through_the_owner(tmp_path):
    from dmls.report import timeline

    path = tmp_path / "studies" / "graphs" / "summary.json"
    write_json(path, valid())
    (row,) = timeline.from_results(tmp_path)
    assert row["job"] == "study graphs" and row["seconds"] == 1.5
    broken = copy.deepcopy(valid())
    broken.pop("rows")
    write_json(path, broken)
    with pytest.raises(summary.SummaryError, match=rf"^{path}: \(top\): 'rows' is a required"):
        timeline.from_results(tmp_path)


def test_a_timed_studys_reservation_is_its_rows_gpus_and_cores_in_the_timeline(tmp_path):
    """Issue #41: the DAG table recorded 0 GPUs for every special study, so the DAG's inherent
    time could not be computed. A timed study records what its job held; one that reserved
    nothing shows its threads as cores and no GPUs."""
    from dmls.report import timeline

    held = valid() | {"reserved": {"gpus": ["1"], "cores": [4, 5, 6, 7], "waited_s": 2.5}}
    assert summary.problems(held) == []
    write_json(tmp_path / "studies" / "graphs" / "summary.json", held)
    (timed,) = timeline.from_results(tmp_path)
    held_row = (timed["gpus"], timed["gpu_ids"], timed["cores"], timed["waited_s"])
    assert held_row == (1, ["1"], 4, 2.5)
    write_json(tmp_path / "studies" / "graphs" / "summary.json", valid())
    (untimed,) = timeline.from_results(tmp_path)
    assert (untimed["gpus"], untimed["cores"]) == (0, 2)
    bad = valid() | {"reserved": {"gpus": ["1"], "cores": [-1], "waited_s": 0.0}}
    assert any("reserved/cores/0" in p for p in summary.problems(bad))


def test_each_study_declares_its_own_keys_in_its_folder():
    """A study's payload schema lives in its folder; the summary schema holds every catalogued
    study to its own, and a study absent from the catalog's folders has none."""
    from dmls.special.catalog import STUDIES

    assert set(payload_keys()) == set(STUDIES)
    assert all((SPECIAL / name / "summary.schema.json").is_file() for name in STUDIES)


EXAMPLE_STUDIES = ROOT / "docs" / "example-report" / "results" / "example" / "studies"


def _example(study: str) -> dict:
    return summary.upgrade(json.loads((EXAMPLE_STUDIES / study / "summary.json").read_text()))


def test_every_summary_of_the_example_is_within_its_bounds():
    for path in sorted(EXAMPLE_STUDIES.glob("*/summary.json")):
        assert summary.problems(_example(path.parent.name)) == [], path


def test_a_probability_outside_0_to_1_or_an_interval_upside_down_is_refused(tmp_path):
    """Issue #55 (1): D2 rendered "Monte Carlo 1.7, 99% interval 0.9–0.1 … agrees within
    chance" and the terminal said ok. A probability is 0 to 1 (the study's schema); an
    interval's low end is at or below its high end, in any study (summary.bounds)."""
    damaged = _example("spare_failure")
    damaged["rows"][0] |= {"monte_carlo": 1.7, "ci_low": 0.9, "ci_high": 0.1}
    assert summary.problems(damaged) == ["rows/0/monte_carlo: 1.7 is greater than the maximum of 1"]
    damaged["rows"][0]["monte_carlo"] = 0.5
    assert summary.problems(damaged) == ["rows/0/ci_low: 0.9 is above ci_high 0.1"]
    path = tmp_path / "spare_failure" / "summary.json"
    write_json(path, damaged)
    with pytest.raises(
        summary.SummaryError, match=re.escape("rows/0/ci_low: 0.9 is above ci_high 0.1; rebuild")
    ):
        summary.read(path)
    nested = valid()
    nested["rows"][0]["ratio"] = {"low": 2, "high": 1}
    assert summary.problems(nested) == ["rows/0/ratio/low: 2 is above high 1"]


def test_a_float32_is_four_bytes_with_its_three_fields_in_range():
    """Issue #55 (1): D3 rendered "Its bytes are 5a 00 85 38 ff" for a float32."""
    damaged = _example("float32_bytes")
    damaged["rows"][0]["bytes_little_endian"] = "5a 00 85 38 ff"
    damaged["rows"][0]["exponent_biased"] = 300
    assert summary.problems(damaged) == [
        "rows/0/bytes_little_endian: '5a 00 85 38 ff' does not match "
        "'^[0-9a-f]{2}( [0-9a-f]{2}){3}$'",
        "rows/0/exponent_biased: 300 is greater than the maximum of 254",
    ]
