"""Local jobs reserve their GPUs and cores (dmls/supervisor/slots.py): disjoint, all or
nothing, released when the holder ends, however it ends."""

import os
import signal
import subprocess
import sys
import threading
import time

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
