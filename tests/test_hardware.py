"""The supervisor never imports torch: the host is probed once per boot, in a child process, and
its answers are read from a cache file by every later run (dmls/supervisor/hardware.py
`host_facts`)."""

import json
import os
from pathlib import Path

import pytest

from conftest import ROOT, make_spec
from dmls.files import write_json
from dmls.supervisor import hardware, supervise
from dmls.supervisor.hardware import HALF_PRECISION_FLAGS, Host, describe, host_facts

SCRIPTS = ROOT / "workflow" / "scripts"


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """A cache folder holding this host's answers, asked of a real child process once."""
    cache_dir = tmp_path_factory.mktemp("hosts")
    return cache_dir, host_facts(cache_dir)


def test_the_cached_answers_are_the_in_process_ones(probed):
    cache_dir, (host, software) = probed
    assert host == Host.probe()
    assert software == describe()
    (path,) = cache_dir.iterdir()
    assert path.name == f"{host.hostname}-{hardware._cache_key()}.json"
    assert Host.from_dict(json.loads(path.read_text())["host"]) == host


def test_to_dict_and_from_dict_round_trip_through_json():
    host = Host("h", 8, ("H200", "H200"), ((9, 0), (9, 0)), True, ("torchao",))
    assert Host.from_dict(json.loads(json.dumps(host.to_dict()))) == host
    assert Host.from_dict(host.to_dict()) == host
    probed = Host.probe()
    assert Host.from_dict(json.loads(json.dumps(probed.to_dict()))) == probed


def test_a_second_call_starts_no_child(probed, monkeypatch):
    cache_dir, answers = probed
    monkeypatch.setattr(hardware.subprocess, "run", pytest.fail)
    assert host_facts(cache_dir) == answers


def test_another_gpu_set_boot_or_install_is_probed_afresh(tmp_path, monkeypatch):
    children = []

    def child():
        children.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
        return {"host": Host("h", 1, (), (), False).to_dict(), "software": {"torch": "x"}}

    monkeypatch.setattr(hardware, "_probe_in_child", child)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    keys = {hardware._cache_key()}
    host_facts(tmp_path)
    host_facts(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    keys.add(hardware._cache_key())
    assert host_facts(tmp_path) == (Host("h", 1, (), (), False), {"torch": "x"})
    assert children == [None, "1"] and len(list(tmp_path.iterdir())) == 2
    monkeypatch.setattr(hardware, "_read_text", lambda path: "another boot")
    keys.add(hardware._cache_key())
    monkeypatch.setattr(hardware, "_version", lambda package: "9.9")
    keys.add(hardware._cache_key())
    assert len(keys) == 4


def test_a_failing_probe_names_its_command_and_error(tmp_path, monkeypatch):
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho 'RuntimeError: CUDA driver too old' >&2\nexit 3\n")
    fake_python.chmod(0o755)
    monkeypatch.setattr(hardware.sys, "executable", str(fake_python))
    with pytest.raises(RuntimeError) as e:
        host_facts(tmp_path / "hosts")
    message = str(e.value)
    assert f"`{fake_python} -m dmls.supervisor.hardware` exited with code 3" in message
    assert message.endswith("RuntimeError: CUDA driver too old")
    assert not (tmp_path / "hosts").exists()


def test_the_supervisor_records_the_cached_host(probed, tmp_path):
    cache_dir, _ = probed
    write_json(tmp_path / "tabular.json", {"status": "unavailable", "reason": "not prepared"})
    spec = make_spec(dataset="tabular", model={"name": "mlp"}, device="cpu", backend="gloo")
    records = []
    for name, host_cache in (("cached", cache_dir), ("in_process", None)):
        with open(tmp_path / f"{name}.log", "w") as log:
            record = supervise.run(
                spec, run_dir=tmp_path / name, data_dir=tmp_path,
                checkpoint_path=tmp_path / "c.pt", log=log, threads=1, host_cache=host_cache,
            )  # fmt: skip
        records.append(record)
    cached, in_process = records
    assert cached["status"] == in_process["status"] == "skipped"
    assert cached["host"] == in_process["host"]
    assert cached["derived"] == in_process["derived"]


def test_a_skip_advises_the_cpu_preset_only_to_a_run_that_does_not_pin_the_cpu_already():
    """Under config/cpu.yaml, DataParallel and NCCL skips said "…or use the CPU preset"."""
    from conftest import make_spec
    from dmls.supervisor.hardware import missing_requirement

    no_gpu = Host("h", 8, (), (), True)
    pinned = make_spec(launcher="dp", nproc_per_node=2, device="cpu", backend="gloo")
    default = make_spec(launcher="dp", nproc_per_node=2, backend="gloo")
    assert "CPU preset" not in missing_requirement(pinned, no_gpu, nodes_here=1)
    assert "or use the CPU preset (--configfile config/cpu.yaml)" in missing_requirement(
        default, no_gpu, nodes_here=1
    )


def test_the_dags_start_says_what_this_host_can_train_and_skips_with_why():
    """Issue "The DAG's long poles" (a user knows what will run): on a host without a GPU,
    the DDP and NCCL runs are skipped, each reason once with its count."""
    cpu = Host("box", 2, (), (), False)
    runs = {
        "a/cpu": make_spec(run="cpu", device="cpu", backend="gloo"),
        "a/nccl": make_spec(run="nccl", device="auto", backend="nccl", launcher="torchrun"),
        "a/nccl2": make_spec(run="nccl2", device="auto", backend="nccl", launcher="torchrun"),
    }
    said = hardware.plan(runs, cpu).splitlines()
    assert said[0] == (
        "This host (box: no GPU, 2 CPUs) can train 1 of the config's 3 runs; it skips 2, each "
        "with its reason:"
    )
    assert said[1].startswith("  2 skipped — backend 'nccl' runs on CUDA devices only")
    gpu = Host("gpus", 16, ("H200", "H200"), ((9, 0), (9, 0)), True)
    assert hardware.plan(runs, gpu) == (
        "This host (gpus: 2 GPU(s) ['H200', 'H200'], 16 CPUs) can train all 3 runs of the config."
    )


def test_the_host_says_how_its_cpu_computes_half_precision():
    # What ATen's convolution checks before it takes oneDNN for bf16 and fp16, and the CPU's
    # instruction sets behind it, as every run's record carries them.
    import torch

    facts = describe()["cpu_half_precision"]
    assert facts["onednn_kernels"] == {
        "bf16": torch.ops.mkldnn._is_mkldnn_bf16_supported(),
        "fp16": torch.ops.mkldnn._is_mkldnn_fp16_supported(),
    }
    cpuinfo = set(Path("/proc/cpuinfo").read_text().split())
    assert facts["flags"] == [f for f in HALF_PRECISION_FLAGS if f in cpuinfo]
