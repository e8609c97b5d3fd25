"""Local jobs side by side without sharing a GPU or a core.

Snakemake counts cores (`threads`) and, given `--resources gpu=N`, GPUs, but it does not say
*which* ones a job gets: two 1-GPU runs would both train on cuda:0 and two 8-core runs would
let the OS mix their threads, and their timings would no longer mean anything. So a timed job
reserves the GPUs and cores it uses here, by holding one lock file per GPU and per core, and
then sees only those (CUDA_VISIBLE_DEVICES, CPU affinity; its processes inherit both).

The locks are `filelock` locks (flock on Linux): the kernel drops them when their holder exits,
so a killed job never leaves a GPU reserved. A job takes all of its slots or none and retries
(no job holds some while waiting for the rest, so no two jobs wait on each other). Jobs of
every workflow of this user on this host share the lock folder, so two checkouts running at
once don't share GPUs either. On a Slurm cluster the job's allocation does this instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

# One folder per user and host; tests point it elsewhere.
SLOTS_DIR_ENV = "DMLS_SLOTS_DIR"
POLL_S = 1.0


def slots_dir() -> Path:
    default = Path(tempfile.gettempdir()) / f"dmls-slots-{os.getuid()}"
    return Path(os.environ.get(SLOTS_DIR_ENV, default))


def gpu_count_here() -> int:
    """The GPUs this process may use, asked of nvidia-smi (no torch imported, no CUDA
    initialised: the workflow asks it when it is parsed) and narrowed by CUDA_VISIBLE_DEVICES;
    0 where nvidia-smi is missing or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return 0
    if out.returncode:
        return 0
    return len(visible_gpus(sum(1 for line in out.stdout.splitlines() if line.strip())))


def visible_gpus(count: int) -> list[str]:
    """The names CUDA_VISIBLE_DEVICES gives (indices, or UUIDs) to the `count` GPUs this process
    sees (`Host.gpu_count`, or torch.cuda.device_count(), which asks NVML without initialising
    CUDA, so CUDA_VISIBLE_DEVICES can still be narrowed)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    return [name.strip() for name in listed.split(",") if name.strip()][:count]


@dataclass(frozen=True)
class Reservation:
    """What a job got: GPU names (as CUDA_VISIBLE_DEVICES takes them), core ids, and how long
    it waited for them."""

    gpus: tuple[str, ...]
    cores: tuple[int, ...]
    waited_s: float

    def environment(self) -> dict[str, str]:
        """What a process started for the job needs in its environment to see only its GPUs."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus)}

    def pin(self) -> None:
        """Bind the calling process (and what it starts later) to the reserved cores."""
        os.sched_setaffinity(0, self.cores)

    def to_dict(self) -> dict[str, object]:
        return {"gpus": list(self.gpus), "cores": list(self.cores), "waited_s": self.waited_s}


def _try_take(stack: ExitStack, folder: Path, kind: str, names: Sequence, count: int) -> list:
    """Lock the first `count` free slots of `names` (locks held by `stack`); fewer if not free."""
    taken: list = []
    for name in names:
        if len(taken) == count:
            break
        lock = FileLock(folder / f"{kind}-{name}.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue
        stack.callback(lock.release)
        taken.append(name)
    return taken


@contextmanager
def reserve(
    gpus: int,
    cores: int,
    *,
    gpu_names: Sequence[str],
    core_ids: Sequence[int] | None = None,
    on_wait: Callable[[str], None] = print,
    poll_s: float = POLL_S,
) -> Iterator[Reservation]:
    """Hold `gpus` of `gpu_names` (`visible_gpus(...)`) and `cores` of `core_ids` (default:
    this process's CPU affinity) until the block ends; wait while other jobs hold them, telling
    `on_wait` once what it waits for."""
    gpu_names = list(gpu_names)
    core_ids = sorted(os.sched_getaffinity(0) if core_ids is None else core_ids)
    if gpus > len(gpu_names):
        raise ValueError(f"asked for {gpus} GPU(s), this host shows {len(gpu_names)}")
    cores = min(cores, len(core_ids))  # Snakemake already caps threads at --cores
    folder = slots_dir()
    folder.mkdir(parents=True, exist_ok=True)
    start, told = time.monotonic(), False
    while True:
        with ExitStack() as stack:
            got_gpus = _try_take(stack, folder, "gpu", gpu_names, gpus)
            got_cores = _try_take(stack, folder, "cpu", core_ids, cores)
            if len(got_gpus) == gpus and len(got_cores) == cores:
                waited = round(time.monotonic() - start, 3) if told else 0.0
                yield Reservation(tuple(got_gpus), tuple(got_cores), waited)
                return
        # All or nothing: what was taken is released before waiting.
        if not told:
            on_wait(
                f"waiting for {gpus} GPU(s) and {cores} core(s) that other jobs hold "
                f"(locks in {folder})"
            )
            told = True
        time.sleep(poll_s)


def core_advice(cores: int, cpus: int, processes: dict[str, int], isolation: str) -> list[str]:
    """What `--cores` leaves to share, said before the DAG starts (timings are what these
    runs compare): `cores` above this host's `cpus`, and runs (id -> processes' worth of
    cores, RunSpec.cpu_shares) that start more processes than `cores`."""
    lines = []
    if cores > cpus:
        lines.append(
            f"--cores {cores} is more than the {cpus} CPUs this process may use: jobs run side "
            "by side share cores, so the timings they record are slower than they would be"
        )
    crowded = {run: n for run, n in processes.items() if n > cores}
    if crowded and isolation != "none":
        run, n = next(iter(crowded.items()))
        lines.append(
            f"{len(crowded)} run(s) start more processes than --cores {cores} (e.g. {run}: "
            f"{n}): their processes share cores, and their times are not those of a host with "
            "a core per process"
        )
    return lines
