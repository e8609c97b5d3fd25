"""What this host can run, and why a run that needs more must be skipped."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import socket
import subprocess
from dataclasses import dataclass, field

import torch

from .spec import RunSpec

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
    fix = "run it on a machine that has them, or use the CPU preset (--configfile config/cpu.yaml)"
    if spec.launcher == "dp" and device != "cuda":
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
        usable = ("torchao",) if spec.launcher != "accelerate" else FP8_BACKENDS
        if not set(usable) & set(host.fp8_backends):
            return (
                "fp8 training needs one of " + ", ".join(usable) + " installed "
                "(e.g. pip install torchao); none is importable here"
            )
    return None


def describe() -> dict:
    """Host and software facts recorded with every run."""
    import accelerate

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
    }


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
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None
