"""Local jobs reserve their GPUs and cores (dmls/supervisor/slots.py): disjoint, all or
nothing, released when the holder ends, however it ends."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT
from dmls.supervisor import slots

GPUS = ["0", "1"]
CORES = [0, 1, 2, 3]


@pytest.fixture(autouse=True)
def lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(slots.SLOTS_DIR_ENV, str(tmp_path / "slots"))
    return tmp_path / "slots"


def reserve(gpus, cores, **kwargs):
    return slots.reserve(gpus, cores, gpu_names=GPUS, core_ids=CORES, poll_s=0.05, **kwargs)


def test_jobs_side_by_side_get_disjoint_gpus_and_cores():
    with reserve(1, 2) as a, reserve(1, 2) as b:
        assert (a.gpus, a.cores) == (("0",), (0, 1))
        assert (b.gpus, b.cores) == (("1",), (2, 3))
        assert a.environment() == {"CUDA_VISIBLE_DEVICES": "0"}
        assert a.waited_s == b.waited_s == 0
    with reserve(2, 4) as both:  # released at the end of the block
        assert both.gpus == ("0", "1") and both.cores == (0, 1, 2, 3)


def test_a_job_waits_for_its_slots_and_holds_none_while_it_waits():
    waits, got = [], {}
    first = reserve(2, 1)
    held = first.__enter__()
    assert held.gpus == ("0", "1")

    def second():
        with reserve(1, 4, on_wait=waits.append) as r:
            got["second"] = r

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.3)
    assert "second" not in got and len(waits) == 1 and "1 GPU(s) and 4 core(s)" in waits[0]
    # All or nothing: the waiting job keeps none of the 3 free cores (it needs 4; it holds
    # them only for an instant while it tries), so another job gets them.
    with reserve(0, 3) as other:
        assert other.cores == (1, 2, 3) and other.waited_s < 0.5
    first.__exit__(None, None, None)
    thread.join(timeout=10)
    assert got["second"].gpus == ("0",) and got["second"].cores == (0, 1, 2, 3)
    assert got["second"].waited_s >= 0.3


def test_a_killed_holder_frees_its_slots(lock_dir):
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys, time; sys.path.insert(0, sys.argv[1]); from dmls.supervisor import slots\n"
            "with slots.reserve(2, 4, gpu_names=['0', '1'], core_ids=[0, 1, 2, 3]):\n"
            "    print('held', flush=True); time.sleep(60)"
        ), str(ROOT / "workflow" / "scripts")],
        env=os.environ | {slots.SLOTS_DIR_ENV: str(lock_dir)},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    waits = []
    with pytest.raises(TimeoutError), _deadline(0.5), reserve(1, 1, on_wait=waits.append):
        pass
    assert waits
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with reserve(2, 4) as r:
        assert r.waited_s < 1 and r.gpus == ("0", "1")


def test_a_reservation_narrows_the_command_it_is_given_to_not_the_caller():
    """Its GPUs reach a command through the command's environment and its cores through
    `pin` in the child (processes.start_and_wait): the process that reserved is unchanged."""
    code = (
        "import os, sys; sys.path.insert(0, sys.argv[1]); from dmls.supervisor import slots\n"
        "before = os.sched_getaffinity(0); cores = sorted(before)[:1]\n"
        "with slots.reserve(0, 1, gpu_names=[], core_ids=cores) as r:\n"
        "    print(r.environment() == {'CUDA_VISIBLE_DEVICES': ''},\n"
        "          'CUDA_VISIBLE_DEVICES' not in os.environ,\n"
        "          os.sched_getaffinity(0) == before, flush=True)\n"
        "    if os.fork() == 0:\n"
        "        r.pin(); print(sorted(os.sched_getaffinity(0)) == cores, flush=True)\n"
        "        os._exit(0)\n"
        "    os.wait()"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "workflow" / "scripts")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.split() == ["True"] * 4


def test_visible_gpus_are_named_as_cuda_visible_devices_names_them(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert slots.visible_gpus(2) == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, GPU-5,7")
    assert slots.visible_gpus(2) == ["3", "GPU-5"]
    assert slots.visible_gpus(0) == []


def test_more_gpus_than_the_host_shows_is_an_error():
    with pytest.raises(ValueError, match="asked for 3 GPU"), reserve(3, 1):
        pass


class _deadline:
    """Raise TimeoutError in the main thread after `seconds` (SIGALRM)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __enter__(self):
        def expire(*_):
            raise TimeoutError

        self.previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)


def test_cores_beyond_the_host_or_below_a_runs_processes_are_said_before_the_dag():
    from dmls.supervisor.slots import core_advice

    runs = {"parallelism/single_gpu": 1, "cluster_torchrun/n2xp2": 4}
    assert core_advice(2, 2, runs, "host") == [
        "1 run(s) start more processes than --cores 2 (e.g. cluster_torchrun/n2xp2: 4): their "
        "processes share cores, and their times are not those of a host with a core per process"
    ]
    assert core_advice(8, 2, runs, "none") == [
        "--cores 8 is more than the 2 CPUs this process may use: jobs run side by side share "
        "cores, so the timings they record are slower than they would be"
    ]
    assert core_advice(4, 16, runs, "host") == []


def fake_nvidia_smi(folder, gpus: int):
    """A PATH holding an nvidia-smi that lists `gpus` GPUs, as the real one's index query."""
    folder.mkdir(exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo {i}\n" for i in range(gpus)))
    smi.chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


def test_the_gpus_here_are_counted_without_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "bin", 2))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert slots.gpu_count_here() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert slots.gpu_count_here() == 1
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert slots.gpu_count_here() == 0


def test_with_isolation_snakemake_schedules_by_the_hosts_gpus(tmp_path):
    """Issue #41: on a 1-GPU host, C waited 150 s inside its job for the GPU other studies held,
    with its core held. Locally with isolation the host's GPUs are a resource Snakemake
    schedules by; a job asks for at most as many as the host has; without isolation, no cap."""
    path = fake_nvidia_smi(tmp_path / "bin", 1)
    bin_dir = Path(sys.executable).parent

    def dry(isolation):
        return subprocess.run(
            [str(bin_dir / "snakemake"), "-n", "--cores", "4", "--forceall", "--config",
             f"results_dir={tmp_path / 'results'}", f"isolation={isolation}"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
            env=os.environ | {"PATH": path},
        )  # fmt: skip

    out = dry("devices")
    assert out.returncode == 0, out.stderr
    # C asks for the GPU it reserves; A1's 2-GPU runs for the one GPU there is.
    job = re.search(r"rule fused_conv:\n(?:    .*\n)*?    resources: (.*)", out.stdout)
    assert job and "gpu=1" in job.group(1)
    gpus = {int(g) for g in re.findall(r"runtime=\d+, gpu=(\d+)", out.stdout)}
    assert gpus == {0, 1}
    # A real run's provided resources: the host's GPUs with isolation, none without.
    target = str(tmp_path / "results" / "studies" / "float32_bytes" / "summary.json")
    for isolation, provided in (("devices", True), ("none", False)):
        run = subprocess.run(
            [str(bin_dir / "snakemake"), "--cores", "1", "--config",
             f"results_dir={tmp_path / isolation}", f"isolation={isolation}", "--",
             target.replace(str(tmp_path / "results"), str(tmp_path / isolation))],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env=os.environ | {"PATH": path},
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        assert ('Provided resources: gpu=Resource("gpu", 1)' in run.stderr) == provided
