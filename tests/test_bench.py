"""bench/epoch_speed.py's CPU path on tiny data, so the benchmark can't rot (its numbers are
meaningless here; the GPU tables are in docs/performance.md)."""

import json
import os
import subprocess
import sys

import pytest

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
    # The least DDP rank under both launchers: its parts add up to the command's seconds, and
    # the forked ranks found torch imported while torchrun's imported it themselves.
    assert report["import_torch_s"] == rows["import torch"]["wall_s"][0]
    launches = report["least_rank"]
    (torchrun,), (forked,) = launches["torchrun"], launches["fork"]
    for run in (torchrun, forked):
        parts = ("to_ranks_s", "ranks_imports_s", "process_group_s", "destroy_s", "after_s")
        assert sum(run[p] for p in parts) == pytest.approx(run["total_s"])
        assert all(run[p] >= 0 for p in parts)
        assert run["ratio"] == pytest.approx(run["total_s"] / run["import_torch_s"])
    assert forked["ranks_imports_s"] < 0.1 < torchrun["ranks_imports_s"]
    assert "the least DDP rank (2 processes) under torchrun's command line" in done.stdout


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


def test_the_dag_table_gives_the_wall_against_the_dags_inherent_time(tmp_path):
    """Issue #41: the longest job, or the GPU-seconds over the host's GPUs, whichever is larger;
    a job's own seconds where Snakemake's benchmark has them, else the launcher's or study's."""
    import pandas as pd

    sys.path.insert(0, str(ROOT / "bench"))
    import dag_table

    table = pd.DataFrame([
        {"job": "parallelism/ddp_2gpu", "gpus": 2, "job_s": 100.0, "seconds": 90.0},
        {"job": "study fused_conv", "gpus": 1, "job_s": None, "seconds": 300.0},
        {"job": "study spare_failure", "gpus": 0, "job_s": None, "seconds": 50.0},
    ])  # fmt: skip
    assert dag_table.inherent(table, 2) == {
        "longest_s": 300.0, "gpu_seconds": 500.0, "gpus": 2, "per_gpu_s": 250.0,
        "inherent_s": 300.0,
    }  # fmt: skip
    assert dag_table.inherent(table, 1)["inherent_s"] == 500.0
    # The command reads a results folder: here one timed study that held one GPU.
    study = tmp_path / "studies" / "graphs"
    study.mkdir(parents=True)
    code = (
        "import json, sys; from dmls import summary\n"
        "s = summary.new('graphs', 'D5', {'rows': [{'status': 'ok', 'reason': None}],"
        " 'control_flow': []}, config={'title': 'D5'}, host={'hostname': 'h',"
        " 'gpus': ['H200']}, threads=4, started_at='2026-11-29T00:00:00+00:00',"
        " wall_time_s=120.0, reserved={'gpus': ['0'], 'cores': [0, 1, 2, 3], 'waited_s': 0.0})\n"
        "summary.write(sys.argv[1], s)"
    )
    env = {"PYTHONPATH": str(ROOT / "workflow" / "scripts")}
    subprocess.run([sys.executable, "-c", code, str(study / "summary.json")], check=True,
                   env=env)  # fmt: skip
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "dag_table.py"), str(tmp_path), "--wall", "150"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "study graphs" in out
    assert (
        "inherent time 120 s: the longest job 120 s, 120 GPU-seconds over 1 GPUs 120 s; the "
        "wall is 1.25x it" in out
    )
    # A later sitting of some studies: their jobs alone, its own wall, no DAG-wide bound.
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "dag_table.py"), str(tmp_path), "--wall", "130",
         "--studies", "graphs"], capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "study graphs" in out and "1 jobs; their seconds add up to 120 s" in out
    assert "the sitting's wall 130 s" in out and "inherent time" not in out


def test_the_fused_conv_benchmark_times_cs_cpu_mode_and_prices_its_protocol(tmp_path):
    """bench/fused_conv_time.py on tiny synthetic data, CPU only (the GPU modes need CUDA)."""
    data = tmp_path / "data"
    code = (
        "import sys; from pathlib import Path; from dmls.data import datasets\n"
        "datasets.prepare('synthetic_cifar', {'n_train': 64, 'n_test': 16, 'seed': 0},"
        " Path(sys.argv[1]))"
    )
    env = os.environ | {"PYTHONPATH": str(ROOT / "workflow" / "scripts")}
    subprocess.run([sys.executable, "-c", code, str(data)], check=True, env=env)
    out = tmp_path / "c.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fused_conv_time.py"), "--data-dir", str(data),
         "--dataset", "synthetic_cifar", "--steps", "22", "--threads", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    cpu = [r for r in report["rows"] if r["mode"] == "cpu"]
    assert [r["depth"] for r in cpu] == report["config"]["depths"]
    for row in cpu:  # 22 steps, 20 of them warm-up (the config's)
        assert row["steps"] == 22 and row["timed_steps"] == 2 and row["forward_ms"] > 0
        # The CPU mode is timed only by default: its protocol is the speed repeats alone.
        cfg = report["config"]
        speed = cfg["repeats"] * (cfg["warmup_steps"] + cfg["timed_steps"]) * row["step_ms"] / 1e3
        assert row["protocol_s"] == pytest.approx(speed)
        assert row["every_mode_trained_s"] > 0
    assert "C's protocol, from these: about" in done.stdout


def test_the_cpu_autocast_benchmark_profiles_a3s_step_in_each_precision(tmp_path):
    out = tmp_path / "autocast.json"
    command = [sys.executable, str(ROOT / "bench" / "cpu_autocast.py"), "--steps", "2",
               "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert list(report["precisions"]) == ["fp32", "bf16", "fp16"]
    assert report["batch_size"] == 32  # A3's batch per rank, as the CPU preset resolves it
    for got in report["precisions"].values():
        assert got["step_ms"] > 0 and got["profiled_ms"] > 0
        # The costliest ops, costliest first, are part of the step's profiled time.
        top = [op["self_ms"] for op in got["top"]]
        assert top == sorted(top, reverse=True) and sum(top) <= got["profiled_ms"] + 1e-9
    # Which convolution ran in fp16 is what the kernels this CPU has decide.
    import torch

    fp16_ops = {op["op"] for op in report["precisions"]["fp16"]["top"]}
    if not torch.ops.mkldnn._is_mkldnn_fp16_supported():
        assert "aten::_slow_conv2d_forward" in fp16_ops
        assert report["precisions"]["fp16"]["onednn"] == {}  # ATen's own, not oneDNN
    # fp32's convolution is oneDNN's, each propagation named with the implementation it ran.
    assert set(report["precisions"]["fp32"]["onednn"]) == {
        "forward_training", "backward_data", "backward_weights"}  # fmt: skip
    assert "oneDNN's convolution: forward_training " in done.stdout
    assert "fp16:" in done.stdout and "x fp32" in done.stdout


def test_peak_source_replays_the_allocators_history_to_the_peak_and_names_who_allocated():
    """bench/peak_source.py's replay (its GPU part runs on a lent host): the most bytes alive
    at once, and the blocks alive then summed by the first frame of this project's code."""
    sys.path.insert(0, str(ROOT / "bench"))
    import peak_source

    def frames(where):
        return [{"filename": "/x/torch/nn/modules/conv.py", "name": "forward"},
                {"filename": f"/r/workflow/scripts/dmls/{where}", "name": "step"}]  # fmt: skip

    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": frames("training/trainer.py")},
        {"action": "alloc", "addr": 2, "size": 50, "frames": frames("data/device_resident.py")},
        {"action": "free_completed", "addr": 2},
        {"action": "alloc", "addr": 3, "size": 70, "frames": frames("data/device_resident.py")},
        {"action": "alloc", "addr": 4, "size": 5, "frames": []},
        {"action": "free_completed", "addr": 3},
        {"action": "free_completed", "addr": 4},
        {"action": "alloc", "addr": 5, "size": 60, "frames": frames("training/trainer.py")},
    ]  # fmt: skip
    most, by = peak_source.peak_blocks(trace)
    assert most == 175  # 100 + 70 + 5, before the 70 was freed
    assert by == {"training/trainer.py:step": 100, "data/device_resident.py:step": 70,
                  "(C++)": 5}  # fmt: skip
