"""The special-study runner: every summary has one frame; strict turns skips into errors."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from conftest import SCHEMA, validated
from dmls import summary
from dmls.files import read_json
from dmls.joblog import job_log
from dmls.special import runner
from dmls.special.fused_conv import build
from dmls.summary import read as read_summary


def fake_study(statuses):
    """A declaration whose study returns rows of `statuses` (what run_study reads of it)."""

    def run(cfg, out_dir, **_):
        return {"rows": [{"status": s, "reason": None if s == "ok" else "why"} for s in statuses]}

    return SimpleNamespace(measure=lambda: run)


@pytest.mark.parametrize(
    ("statuses", "overall"),
    [(["ok", "ok"], "ok"), (["ok", "skipped"], "ok"), (["skipped"], "skipped"),
     (["ok", "failed", "skipped"], "failed")],
)  # fmt: skip
def test_overall_status(statuses, overall, tmp_path, monkeypatch):
    monkeypatch.setitem(runner.STUDIES, "fake", fake_study(statuses))
    returned = runner.run_study("fake", {"title": "T"}, tmp_path)
    assert returned["status"] == overall
    written = summary.read(tmp_path / "summary.json")
    assert written["status"] == overall and written["title"] == "T"
    assert sum(written["counts"].values()) == len(statuses)
    assert written["host"]["torch"] and written["config"] == {"title": "T"}


def test_strict_raises_after_writing_the_summary(tmp_path, monkeypatch):
    monkeypatch.setitem(runner.STUDIES, "fake", fake_study(["ok", "skipped"]))
    with pytest.raises(runner.StudyIncomplete, match="1 part"):
        runner.run_study("fake", {"title": "T"}, tmp_path, strict=True)
    assert summary.read(tmp_path / "summary.json")["counts"] == {"ok": 1, "skipped": 1}


def test_every_configured_study_has_a_runner():
    schema = yaml.safe_load(SCHEMA.read_text())
    assert set(schema["properties"]["special_studies"]["properties"]) == set(runner.STUDIES)


class Params(SimpleNamespace):
    """A rule's params as Snakemake gives them: attributes, and `get` with a default."""

    def get(self, name, default=None):
        return getattr(self, name, default)


def fake_snakemake(tmp_path, **fields):
    """What Snakemake hands a `script:` (only the attributes the entry points read)."""
    config = validated({"strict": False, "isolation": "none"})
    defaults = dict(log=[str(tmp_path / "job.log")], threads=1, config=config)
    return SimpleNamespace(**(defaults | fields))


def test_the_extension_build_job_says_why_it_built_nothing_on_a_host_without_gpu(
    tmp_path, monkeypatch
):
    import os

    # The build runs in a process of its own: hide the GPUs from it.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    record_path = tmp_path / "build" / "fused_conv_relu.json"
    record_path.parent.mkdir()
    job = fake_snakemake(
        tmp_path,
        output=SimpleNamespace(record=str(record_path)),
        params=SimpleNamespace(build_root=str(tmp_path / "ext")),
    )
    with job_log(job.log[0]) as log:
        build.build_from_snakemake(job, log)
    record = read_json(record_path)
    assert record["status"] == "skipped" and "no CUDA GPU" in record["reason"]
    assert "TORCH_EXTENSIONS_DIR" not in os.environ  # the job's own process is unchanged


def test_study_c_loads_the_extension_the_build_job_compiled(tmp_path, monkeypatch):
    """The study's process is given the prebuilt extension's folder; the job's own process
    keeps its environment (one policy: per command)."""
    import os

    from dmls.supervisor import processes

    started = []

    def start_and_wait(commands, log, **_):
        started.extend(commands)
        return processes.Outcome([0], 0.1, None)

    monkeypatch.setattr(processes, "start_and_wait", start_and_wait)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/elsewhere")
    built = tmp_path / "fused_conv_relu.json"
    built.write_text('{"status": "ok", "build_root": "/prebuilt"}')
    job = fake_snakemake(
        tmp_path,
        input=SimpleNamespace(extension=str(built)),
        output=SimpleNamespace(summary=str(tmp_path / "fake" / "summary.json")),
        params=SimpleNamespace(study="fused_conv", cfg={"title": "T"}),
    )
    with job_log(job.log[0]) as log:
        runner.main_from_snakemake(job, log)
    (command,) = started
    assert command.argv[1:4] == ["-m", "dmls.special.runner", "fused_conv"]
    assert command.env["TORCH_EXTENSIONS_DIR"] == "/prebuilt"
    assert os.environ["TORCH_EXTENSIONS_DIR"] == "/elsewhere"
    # On a host without a GPU, kineto's "gpuGetDeviceCount failed" is not logged as an ERROR.
    assert ("KINETO_LOG_LEVEL" in command.env) == (torch.cuda.device_count() == 0)


def test_a_profiled_study_on_a_host_without_a_gpu_logs_no_kineto_error(tmp_path, monkeypatch):
    """Before: "ERROR:... DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35" in
    B4's and D1's logs of a healthy CPU run. D1 profiles its steps; one step is enough."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    job_config = validated({})["special_studies"]
    summary = tmp_path / "d1" / "summary.json"
    job = fake_snakemake(
        tmp_path,
        output=SimpleNamespace(summary=str(summary)),
        input=SimpleNamespace(),
        params=SimpleNamespace(study="lenet_memory", cfg=job_config["lenet_memory"] | {"steps": 1}),
    )
    with job_log(job.log[0]) as log:
        runner.main_from_snakemake(job, log)
    text = Path(job.log[0]).read_text()
    assert read_summary(summary)["status"] in ("ok", "skipped")
    assert "gpuGetDeviceCount" not in text and "ERROR" not in text


def test_a_timed_study_records_the_cores_and_gpus_its_job_held(tmp_path):
    """Issue #41: the DAG table can only weigh a study against the host's GPUs if the study
    says what it held. Here D3 (quick, no GPU) as a timed job on this host's cores."""
    job_config = validated({})["special_studies"]
    summary = tmp_path / "d3" / "summary.json"
    job = fake_snakemake(
        tmp_path,
        output=SimpleNamespace(summary=str(summary)),
        input=SimpleNamespace(),
        threads=1,
        params=Params(study="float32_bytes", cfg=job_config["float32_bytes"], timed=True),
    )
    job.config = validated({"strict": False, "isolation": "host"})
    with job_log(job.log[0]) as log:
        runner.main_from_snakemake(job, log)
    reserved = read_summary(summary)["reserved"]
    assert len(reserved["cores"]) == 1 and reserved["waited_s"] >= 0
    assert reserved["cores"][0] in os.sched_getaffinity(0)
    assert reserved["gpus"] == [] or torch.cuda.device_count() > 0
