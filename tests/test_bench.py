"""bench/epoch_speed.py's CPU path on tiny data, so the benchmark can't rot (its numbers are
meaningless here; the GPU tables are in docs/performance.md)."""

import json
import subprocess
import sys

from conftest import ROOT


def test_the_speed_benchmark_runs_its_cpu_path_and_writes_its_table(tmp_path):
    out = tmp_path / "speed.json"
    bench = str(ROOT / "bench" / "epoch_speed.py")
    command = [sys.executable, bench, "--device", "cpu", "--n-train", "256", "--n-test", "64",
               "--epochs", "2", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {r["name"]: r for r in report["rows"]}
    assert list(rows) == ["course", "device_eager", "device_graph"]
    assert rows["course"]["loader"] == "torch" and rows["device_eager"]["loader"] == "device"
    # No GPU: the graph row ran eagerly and says why.
    assert rows["device_graph"]["step"] == "eager"
    assert (
        rows["device_graph"]["eager_reason"] == "CUDA graphs need a GPU; this run trains on the CPU"
    )
    for row in rows.values():
        assert (
            row["n_train"] == 256 and row["steady_epoch_s"] > 0 and 0 <= row["test_accuracy"] <= 1
        )
    speedup = {r["claim"]: r["value"] for r in report["ratios"]}
    best = min(("device_eager", "device_graph"), key=lambda n: rows[n]["steady_epoch_s"])
    claim = f"{best} vs course, batch 32"
    assert speedup[claim] == rows["course"]["steady_epoch_s"] / rows[best]["steady_epoch_s"]
    assert "run" in done.stdout and "vs course" in done.stdout  # the printed table


def test_the_ddp_scaling_benchmark_runs_its_cpu_path(tmp_path):
    out = tmp_path / "ddp.json"
    bench = str(ROOT / "bench" / "ddp_scaling.py")
    command = [sys.executable, bench, "--device", "cpu", "--n-train", "256", "--epochs", "2",
               "--variants", "one_graph", "ddp_graph_bucket_view", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert [r["processes"] for r in rows.values()] == [1, 2]
    for row in rows.values():
        # 256 images / batch 128 per process; two timed epochs and one profiled.
        assert row["steps_per_epoch"] == 2 // row["processes"]
        assert len(row["epochs_s"]) == 2 and row["steady_epoch_s"] > 0
        assert row["step"]["mode"] == "eager"  # no GPU: no graph, and the record says why
        assert "Self CPU time total" in row["host_ops"]  # the profiler's table of host ops
    assert rows["ddp_graph_bucket_view"]["allreduce_grads_us"] > 0
    assert "ddp_graph_bucket_view" in done.stdout and "vs one" in done.stdout


def test_the_launch_overhead_benchmark_runs_its_cpu_parts(tmp_path):
    out = tmp_path / "overhead.json"
    bench = str(ROOT / "bench" / "launch_overhead.py")
    command = [sys.executable, bench, "--repeats", "1", "--no-job", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["bytecode"]
    rows = {r["process"]: r for r in report["processes"]}
    # No GPU: the CUDA rows are left out; every other process was timed.
    assert "import torch" in rows and not any("CUDA" in name for name in rows)
    assert all(r["wall_s"][0] > 0 and r["cpu_s"][0] >= 0 for r in rows.values())
    assert rows["import torch, torch._dynamo"]["wall_s"][0] > rows["interpreter"]["wall_s"][0]
    packages = dict(report["import_profile"])
    assert any(name.startswith("torch") for name in packages)
    for rdzv in ("c10d", "static"):
        (bare,) = report["bare_torchrun"][rdzv]
        assert bare["to_ranks_s"] > 0 and bare["after_ranks_s"] > 0
        assert bare["total_s"] >= bare["to_ranks_s"] + bare["after_ranks_s"]


def test_the_checkpoint_cost_benchmark_times_every_part_on_the_cpu(tmp_path):
    out = tmp_path / "checkpoint.json"
    bench = str(ROOT / "bench" / "checkpoint_cost.py")
    command = [sys.executable, bench, "--repeats", "2", "--dir", str(tmp_path), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["payload_mib"] > 1  # A1's weights and AdamW
    parts = ("state_to_cpu", "serialise", "sha256", "write_fsync_rename", "write_rename_no_fsync")
    assert set(report["each_ms"]) == set(parts)
    assert all(len(ms) == 2 and min(ms) > 0 for ms in report["each_ms"].values())
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]  # its files cleaned up


def test_the_one_host_step_benchmark_times_every_setting_it_has_the_cores_for(tmp_path):
    out = tmp_path / "one_host_step.json"
    bench = str(ROOT / "bench" / "one_host_step.py")
    command = [sys.executable, bench, "--threads", "1", "--steps", "220", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    settings = {s["name"]: s for s in report["settings"]}
    assert "two DDP, passive" in settings and "two DDP, no buffer broadcast" in settings
    assert settings["two DDP, passive"]["env"] == {"OMP_WAIT_POLICY": "PASSIVE"}
    for name, setting in settings.items():  # every rank of every setting timed its parts
        assert [r["rank"] for r in setting["ranks"]] == (
            [0, 1] if setting["ddp"] and setting["procs"] == 2 else [0] * setting["procs"]
        ), name
        for row in setting["ranks"]:
            assert row["step_ms"] >= max(row["forward_ms"], row["backward_ms"]) > 0
            assert row["switches_per_1000_steps"] >= 0
