"""How a run is started: the one place that turns a run spec into launcher commands.

Commands are argument lists (never shell strings), so no config value is ever parsed by a shell.
Each node is one launcher agent; without Slurm, several nodes are emulated by starting one
agent per node on this host, all meeting at a rendezvous on loopback.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .spec import RunSpec

WORKER = Path(__file__).resolve().parents[1] / "train.py"
LOOPBACK = "127.0.0.1"
ACCELERATE_PRECISION = {"fp32": "no", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8"}


@dataclass(frozen=True)
class Command:
    """One process to start: its argv and the variables it adds to the environment."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def free_port() -> int:
    """A port free now on loopback; the launcher binds it moments later."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def die_with_parent(sig: signal.Signals) -> None:
    """Ask Linux to send this process `sig` when its parent dies (prctl PR_SET_PDEATHSIG), so
    no launcher or rank outlives the process that started it. Elsewhere it does nothing."""
    if sys.platform != "linux":
        return
    PR_SET_PDEATHSIG = 1
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig)) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def build_commands(
    spec: RunSpec, worker_args: list[str], *, device: str, port: int, threads: int
) -> list[Command]:
    """The launcher command(s) for `spec`, one per (emulated) node.

    `device` is the resolved device ('cpu' or 'cuda'), `port` the rendezvous port and `threads`
    the CPU threads this run may use on this host, shared among its processes.
    """
    per_process = max(1, threads // spec.processes)
    env = {"OMP_NUM_THREADS": str(per_process), "DMLS_THREADS_PER_PROCESS": str(per_process)}
    python = sys.executable
    worker = [str(WORKER), *worker_args]

    if spec.launcher in ("single", "dp"):
        return [Command([python, *worker], env)]

    if spec.launcher == "torchrun":
        commands = []
        for node in range(spec.nodes):
            argv = [
                python, "-m", "torch.distributed.run",
                "--nnodes", str(spec.nodes),
                "--nproc_per_node", str(spec.nproc_per_node),
                "--rdzv_backend", "c10d",
                "--rdzv_endpoint", f"{LOOPBACK}:{port}",
                "--rdzv_id", f"{spec.study}.{spec.run}.{port}",
                # Every emulated node resolves the loopback endpoint as its own host: say which
                # one serves the rendezvous store instead of letting them race for the port.
                "--rdzv_conf", f"is_host={'true' if node == 0 else 'false'}",
                "--max_restarts", "0",
                *worker,
            ]  # fmt: skip
            commands.append(Command(argv, env))
        return commands

    if spec.launcher == "accelerate":
        # On a CPU host `--multi_gpu` is what starts N cooperating processes, and only with
        # ACCELERATE_USE_CPU=1; `--cpu --num_processes N` starts one. The engine checks the
        # world size it gets either way.
        cpu_env = {"ACCELERATE_USE_CPU": "1"} if device == "cpu" else {}
        mode = ["--multi_gpu"] if spec.processes > 1 else (["--cpu"] if device == "cpu" else [])
        commands = []
        for node in range(spec.nodes):
            argv = [
                python, "-m", "accelerate.commands.launch",
                *mode,
                "--num_processes", str(spec.processes),
                "--num_machines", str(spec.nodes),
                "--machine_rank", str(node),
                "--main_process_ip", LOOPBACK,
                "--main_process_port", str(port),
                "--mixed_precision", ACCELERATE_PRECISION[spec.precision],
                "--num_cpu_threads_per_process", str(per_process),
                "--dynamo_backend", "no",
                *worker,
            ]  # fmt: skip
            commands.append(Command(argv, env | cpu_env))
        return commands

    raise ValueError(f"unknown launcher {spec.launcher!r}")
