"""The special-study runner: every summary has one frame; strict turns skips into errors."""

import pytest
import yaml

from conftest import SCHEMA
from dmls import special_studies
from dmls.io import read_json


def fake_study(statuses):
    def run(cfg, out_dir, **_):
        return {"rows": [{"status": s, "reason": None if s == "ok" else "why"} for s in statuses]}

    return run


@pytest.mark.parametrize(
    ("statuses", "overall"),
    [(["ok", "ok"], "ok"), (["ok", "skipped"], "ok"), (["skipped"], "skipped"),
     (["ok", "failed", "skipped"], "failed")],
)  # fmt: skip
def test_overall_status(statuses, overall, tmp_path, monkeypatch):
    monkeypatch.setitem(special_studies.STUDIES, "fake", fake_study(statuses))
    summary = special_studies.run_study("fake", {"title": "T"}, tmp_path)
    assert summary["status"] == overall
    written = read_json(tmp_path / "summary.json")
    assert written["status"] == overall and written["title"] == "T"
    assert sum(written["counts"].values()) == len(statuses)
    assert written["host"]["torch"] and written["config"] == {"title": "T"}


def test_strict_raises_after_writing_the_summary(tmp_path, monkeypatch):
    monkeypatch.setitem(special_studies.STUDIES, "fake", fake_study(["ok", "skipped"]))
    with pytest.raises(special_studies.StudyIncomplete, match="1 part"):
        special_studies.run_study("fake", {"title": "T"}, tmp_path, strict=True)
    assert read_json(tmp_path / "summary.json")["counts"] == {"ok": 1, "skipped": 1}


def test_every_configured_study_has_a_runner():
    schema = yaml.safe_load(SCHEMA.read_text())
    assert set(schema["properties"]["special_studies"]["properties"]) == set(
        special_studies.STUDIES
    )
