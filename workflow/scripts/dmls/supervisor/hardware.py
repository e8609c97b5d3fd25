"""What this host can run, and why a run that needs more must be skipped.

Importing this module is cheap: torch (3-4 s to import) is imported only by the functions that
ask it something, so the supervisor of a run can use the cached answers (`host_facts`) without
ever importing it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dmls.config.spec import RunSpec
from dmls.files import read_json, write_json

FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: the first GPUs with fp8 tensor cores
FP8_BACKENDS = ("transformer_engine", "msamp", "torchao")


@dataclass(frozen=True)
class Host:
    hostname: str
    cpu_count: int
    cuda_devices: tuple[str, ...]
    cuda_capabilities: tuple[tuple[int, int], ...]
    nccl_available: bool
    fp8_backends: tuple[str, ...] = field(default=())

    @classmethod
    def probe(cls) -> Host:
        """This process's host, asked of torch (which initialises CUDA)."""
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return cls(
            hostname=socket.gethostname(),
            cpu_count=os.cpu_count() or 1,
            cuda_devices=tuple(torch.cuda.get_device_name(i) for i in range(count)),
            cuda_capabilities=tuple(torch.cuda.get_device_capability(i) for i in range(count)),
            nccl_available=torch.distributed.is_available()
            and torch.distributed.is_nccl_available(),
            fp8_backends=tuple(m for m in FP8_BACKENDS if importlib.util.find_spec(m)),
        )

    @property
    def gpu_count(self) -> int:
        return len(self.cuda_devices)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Host:
        """The inverse of `to_dict`, also of its JSON (whose lists were tuples)."""
        return cls(
            hostname=data["hostname"],
            cpu_count=data["cpu_count"],
            cuda_devices=tuple(data["cuda_devices"]),
            cuda_capabilities=tuple((int(a), int(b)) for a, b in data["cuda_capabilities"]),
            nccl_available=data["nccl_available"],
            fp8_backends=tuple(data["fp8_backends"]),
        )


def resolved_device(spec: RunSpec, host: Host) -> str:
    """'cpu' or 'cuda': what `device: auto` becomes on this host."""
    if spec.device == "auto":
        return "cuda" if host.gpu_count else "cpu"
    return spec.device


def gpus_needed(spec: RunSpec, host: Host, nodes_here: int) -> int:
    """GPUs this run occupies on this host, which holds `nodes_here` of its nodes (emulated
    nodes all live here; Slurm nodes one each)."""
    if not (spec.requested_gpus or resolved_device(spec, host) == "cuda"):
        return 0
    return spec.replicas // spec.nodes * nodes_here


def missing_requirement(spec: RunSpec, host: Host, *, nodes_here: int) -> str | None:
    """Why this host, holding `nodes_here` of the run's nodes, can't run `spec` (with how to fix
    it), or None when it can."""
    device = resolved_device(spec, host)
    fix = (
        "run it on a machine that has them"
        # A run that pins the CPU already is what the CPU preset gives: no advice to use it.
        + ("" if spec.device == "cpu" else ", or use the CPU preset (--configfile config/cpu.yaml)")
    )
    if spec.replicates_in_one_process and device != "cuda":
        return (
            "nn.DataParallel replicates a model over CUDA devices; on the CPU it would be one "
            f"process on one device, so there is no parallelism to measure ({fix})"
        )
    if spec.backend == "nccl" and device != "cuda":
        return f"backend 'nccl' runs on CUDA devices only; this run's device is {device} ({fix})"
    if spec.backend == "nccl" and not host.nccl_available:
        return "backend 'nccl' is not available in this torch build (use 'gloo')"
    needed = gpus_needed(spec, host, nodes_here)
    if needed > host.gpu_count:
        found = f"{host.gpu_count} {list(host.cuda_devices)}" if host.gpu_count else "0"
        return f"needs {needed} CUDA GPU(s) on this host, found {found} ({fix})"
    if spec.precision == "fp8":
        if device != "cuda":
            return f"fp8 needs a CUDA GPU (compute capability >= 8.9); the device is {device}"
        too_old = [c for c in host.cuda_capabilities if c < FP8_MIN_CAPABILITY]
        if too_old:
            return f"fp8 needs compute capability >= 8.9; this host's GPUs have {too_old}"
        usable = FP8_BACKENDS if spec.precision_by_launcher else ("torchao",)
        if not set(usable) & set(host.fp8_backends):
            return (
                "fp8 training needs one of " + ", ".join(usable) + " installed "
                "(e.g. pip install torchao); none is importable here"
            )
    return None


def plan(runs: Mapping[str, RunSpec], host: Host) -> str:
    """What this host can train and must skip of `runs` (run id -> spec), said when the DAG
    starts: the host, how many runs it can train, and each reason it can't with its runs'
    count; every node of a run is emulated here (`missing_requirement` with all its nodes).
    Data that can't be had is found later, by `prepare_data`, and skipped with its reason."""
    skipped: dict[str, list[str]] = {}
    for run_id, spec in runs.items():
        if why := missing_requirement(spec, host, nodes_here=spec.nodes):
            skipped.setdefault(why, []).append(run_id)
    gpus = f"{host.gpu_count} GPU(s) {list(host.cuda_devices)}" if host.gpu_count else "no GPU"
    ran = len(runs) - sum(map(len, skipped.values()))
    head = f"This host ({host.hostname}: {gpus}, {host.cpu_count} CPUs) can train"
    if not skipped:
        return f"{head} all {len(runs)} runs of the config."
    lines = [
        f"{head} {ran} of the config's {len(runs)} runs; it skips {len(runs) - ran}, each "
        "with its reason:"
    ]
    return "\n".join(lines + [f"  {len(ids)} skipped — {why}" for why, ids in skipped.items()])


def describe() -> dict:
    """Host and software facts recorded with every run."""
    import accelerate
    import torch

    cuda = torch.version.cuda if torch.cuda.is_available() else None
    count = torch.cuda.device_count() if cuda else 0
    nccl = None
    if torch.cuda.is_available() and torch.distributed.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "nccl": nccl,
        "gpu_memory_bytes": [
            torch.cuda.get_device_properties(i).total_memory for i in range(count)
        ],
        "cuda_driver": _nvidia_driver() if count else None,
        "accelerate": accelerate.__version__,
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_half_precision": _cpu_half_precision(torch),
    }


# The instruction sets that decide how a CPU computes bf16 and fp16 (Linux's /proc/cpuinfo names).
HALF_PRECISION_FLAGS = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16", "avx_ne_convert")


def _cpu_half_precision(torch: Any) -> dict[str, Any]:
    """How this CPU computes bf16 and fp16: whether PyTorch's oneDNN has kernels for each here
    (the check ATen's convolution makes before taking oneDNN: without an fp16 kernel, an fp16
    convolution runs ATen's reference loops, aten::_slow_conv2d_forward/backward), and which
    of the instruction sets behind them the CPU has (bf16 kernels without bf16 instructions
    convert to fp32 and back). None where this torch build can't say."""
    try:
        kernels = {
            "bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
            "fp16": bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()),
        }
    except (AttributeError, RuntimeError):
        kernels = None
    return {"onednn_kernels": kernels, "flags": cpu_flags(HALF_PRECISION_FLAGS)}


def cpu_flags(names: tuple[str, ...]) -> list[str] | None:
    """Which of the instruction sets `names` (Linux's /proc/cpuinfo names) this CPU lists, in
    their order; None where /proc/cpuinfo can't be read."""
    try:
        with open("/proc/cpuinfo") as f:
            words = set(f.read().split())
    except OSError:
        return None
    return [name for name in names if name in words]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str | None:
    """The NVIDIA driver version (torch reports the CUDA runtime, not the driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


# Bump when Host or describe() change what they hold: older cache files then go unused.
CACHE_VERSION = 2
# Packages whose versions the probe's answers depend on (fp8_backends, describe()).
PROBED_PACKAGES = ("torch", "accelerate", *FP8_BACKENDS)


def host_facts(cache_dir: Path) -> tuple[Host, dict[str, Any]]:
    """`Host.probe()` and `describe()`, asked once per boot, interpreter and GPU set of a host
    and then read from `<cache_dir>/<hostname>-<key>.json`.

    Why: asking them in-process costs every run's supervisor ~6 s on a 2×H200 host (import
    torch 3.4 s, CUDA initialisation, accelerate for describe()), paid by each of ~50 runs, and
    serially by runs that need both GPUs. The first run on a host asks a child process
    (`python -m dmls.supervisor.hardware`), so this process never imports torch; the later ones
    read the file.

    The key is a hash of the hostname, the boot id, CUDA_VISIBLE_DEVICES, the interpreter and
    the versions of torch, accelerate and the fp8 backends: a reboot, another GPU set, another
    environment or a pip install probes afresh. Nothing else does: a driver reloaded or MIG
    reconfigured without a reboot leaves stale answers (delete the folder), and a GPU that dies
    after the probe makes the ranks fail with their own error, as it would have anyway."""
    path = Path(cache_dir) / f"{socket.gethostname()}-{_cache_key()}.json"
    if path.exists():
        facts = read_json(path)
    else:
        facts = _probe_in_child()
        write_json(path, facts)  # atomic: a concurrent first run writes the same answers
    return Host.from_dict(facts["host"]), facts["software"]


def _cache_key() -> str:
    facts = {
        "version": CACHE_VERSION,
        "hostname": socket.gethostname(),
        "boot_id": _read_text("/proc/sys/kernel/random/boot_id"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "python": sys.executable,
        "packages": {name: _version(name) for name in PROBED_PACKAGES},
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _probe_in_child() -> dict[str, Any]:
    """What `python -m dmls.supervisor.hardware` prints, run with this process's environment."""
    scripts = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(p for p in (scripts, os.environ.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "dmls.supervisor.hardware"]
    done = subprocess.run(
        command, env=os.environ | {"PYTHONPATH": pythonpath}, capture_output=True, text=True
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise RuntimeError(
            f"probing the host failed: `{shlex.join(command)}` exited with code "
            f"{done.returncode}:\n{tail}"
        )
    # The JSON is the last line: anything a library printed on import comes before it.
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps({"host": Host.probe().to_dict(), "software": describe()}))
