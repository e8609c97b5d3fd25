"""How ranks are started: the one place that builds launcher commands, for a training run's
spec (`build_commands`) and for the special studies that need several processes
(`group_commands`); supervisor/processes.py starts and stops them.

Commands are argument lists (never shell strings), so no config value is ever parsed by a shell.
Each node is one launcher agent, for a training run and a special study's ranks alike. Inside a
Slurm allocation, one `srun` starts node_agent.py on every node, which builds that node's agent
command there and picks the rendezvous host, the step's first node (the one place it is chosen);
elsewhere, several nodes are emulated by starting one agent per node on this host, all meeting
on loopback.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dmls.config.spec import RunSpec

SCRIPTS = Path(__file__).resolve().parents[2]
WORKER = SCRIPTS / "rank.py"
NODE_AGENT = SCRIPTS / "node_agent.py"
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


def build_commands(
    spec: RunSpec,
    worker_args: list[str],
    *,
    device: str,
    port: int,
    threads: int,
    srun: bool = False,
) -> list[Command]:
    """The launcher command(s) for `spec`: one per emulated node, or one `srun` for all nodes.

    `device` is the resolved device ('cpu' or 'cuda'), `port` the rendezvous port and `threads`
    the CPU threads this run may use on each host, shared among the processes there. With
    `srun`, the nodes are those of the Slurm allocation this runs in.
    """
    processes_per_host = spec.nproc_per_node if srun else spec.processes
    per_process = max(1, threads // processes_per_host)
    # The OpenMP wait policy reaches every rank through its launcher's environment (and through
    # srun's, which passes the environment on to each node's agent).
    wait = (
        {}
        if spec.omp_wait_policy == "default"
        else {"OMP_WAIT_POLICY": spec.omp_wait_policy.upper()}
    )
    return [
        Command(c.argv, c.env | wait)
        for c in _launcher_commands(spec, worker_args, device, per_process, threads, port, srun)
    ]


def _launcher_commands(
    spec: RunSpec,
    worker_args: list[str],
    device: str,
    per_process: int,
    threads: int,
    port: int,
    srun: bool,
) -> list[Command]:
    python = sys.executable

    if spec.launcher in ("single", "dp"):
        return [Command([python, str(WORKER), *worker_args], _thread_env(per_process))]
    if srun:
        agent = [
            python,
            str(NODE_AGENT),
            "--device",
            device,
            "--port",
            str(port),
            "--threads-per-process",
            str(per_process),
            "--",
            *worker_args,
        ]
        return [srun_command(agent, nodes=spec.nodes, tasks_per_node=1, cpus_per_task=threads)]
    return [
        agent_command(
            spec,
            worker_args,
            device=device,
            node_rank=node,
            master_addr=LOOPBACK,
            port=port,
            threads_per_process=per_process,
        )
        for node in range(spec.nodes)
    ]


def agent_command(
    spec: RunSpec,
    worker_args: list[str],
    *,
    device: str,
    node_rank: int,
    master_addr: str,
    port: int,
    threads_per_process: int,
) -> Command:
    """The torchrun / accelerate agent of node `node_rank`; node 0 at `master_addr` hosts the
    rendezvous on `port`."""
    if spec.launcher == "torchrun":
        return torchrun_command(
            [str(WORKER)],
            worker_args,
            nodes=spec.nodes,
            nproc_per_node=spec.nproc_per_node,
            node_rank=node_rank,
            master_addr=master_addr,
            port=port,
            rdzv_id=f"{spec.study}.{spec.run}.{port}",
            threads_per_process=threads_per_process,
        )

    env = _thread_env(threads_per_process)
    worker = [str(WORKER), *worker_args]
    python = sys.executable

    if spec.launcher == "accelerate":
        # On a CPU host `--multi_gpu` is what starts N cooperating processes, and only with
        # ACCELERATE_USE_CPU=1; `--cpu --num_processes N` starts one. The engine checks the
        # world size it gets either way.
        cpu_env = {"ACCELERATE_USE_CPU": "1"} if device == "cpu" else {}
        mode = ["--multi_gpu"] if spec.processes > 1 else (["--cpu"] if device == "cpu" else [])
        argv = [
            python,
            "-m",
            "accelerate.commands.launch",
            *mode,
            "--num_processes",
            str(spec.processes),
            "--num_machines",
            str(spec.nodes),
            "--machine_rank",
            str(node_rank),
            "--main_process_ip",
            master_addr,
            "--main_process_port",
            str(port),
            "--mixed_precision",
            ACCELERATE_PRECISION[spec.precision],
            "--num_cpu_threads_per_process",
            str(threads_per_process),
            "--dynamo_backend",
            "no",
            *worker,
        ]
        return Command(argv, env | cpu_env)

    raise ValueError(f"launcher {spec.launcher!r} has no per-node agent")


def torchrun_command(
    program: list[str],
    args: list[str],
    *,
    nodes: int,
    nproc_per_node: int,
    node_rank: int,
    master_addr: str,
    port: int,
    rdzv_id: str,
    threads_per_process: int,
) -> Command:
    """The torchrun agent of node `node_rank`, starting `nproc_per_node` processes of `program`
    (a script's path, or "-m" and a module) with `args`; node 0 at `master_addr` hosts the
    rendezvous `rdzv_id` on `port`."""
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nodes),
        "--nproc_per_node",
        str(nproc_per_node),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"{master_addr}:{port}",
        "--rdzv_id",
        rdzv_id,
        # Say which agent serves the rendezvous store rather than let torchrun guess from
        # host names: emulated nodes (and nodes sharing a host) all look like its host.
        "--rdzv_conf",
        f"is_host={'true' if node_rank == 0 else 'false'}",
        "--max_restarts",
        "0",
        *program,
        *args,
    ]
    return Command(argv, _thread_env(threads_per_process))


def srun_command(
    program: list[str],
    *,
    nodes: int,
    tasks_per_node: int,
    cpus_per_task: int,
    immediate_s: int | None = None,
) -> Command:
    """One `srun` step running `program` (an argv) as `tasks_per_node` tasks on each of `nodes`
    nodes; with `immediate_s`, the step fails when Slurm can't give it the nodes within that
    many seconds."""
    argv = [
        "srun",
        "--nodes",
        str(nodes),
        "--ntasks",
        str(nodes * tasks_per_node),
        "--ntasks-per-node",
        str(tasks_per_node),
        "--cpus-per-task",
        str(cpus_per_task),
        *([f"--immediate={immediate_s}"] if immediate_s is not None else []),
        # One task failing ends the others: none waits for a peer that is gone.
        "--kill-on-bad-exit=1",
        *program,
    ]
    return Command(argv)


def group_commands(
    module: str,
    args: list[str],
    *,
    nodes: int,
    nproc_per_node: int,
    port: int,
    name: str,
    srun: bool = False,
    threads_per_process: int = 1,
) -> list[Command]:
    """The commands that start `nodes` × `nproc_per_node` processes of `python -m module args`
    (a special study's ranks) as a training run's are started: a torchrun agent per node, in
    rendezvous `name` on `port`. Here, one agent per emulated node, meeting on loopback; with
    `srun`, one srun step over `nodes` nodes of the Slurm cluster whose task on each node is
    node_agent.py, which starts that node's torchrun agent (the step's first node serves the
    rendezvous: `group_agent_command`)."""
    if srun:
        agent = [
            sys.executable,
            str(NODE_AGENT),
            "--port",
            str(port),
            "--threads-per-process",
            str(threads_per_process),
            "--group",
            name,
            "--nnodes",
            str(nodes),
            "--nproc-per-node",
            str(nproc_per_node),
            "--",
            module,
            *args,
        ]
        commands = [
            srun_command(
                agent,
                nodes=nodes,
                tasks_per_node=1,
                cpus_per_task=threads_per_process * nproc_per_node,
                # A step of its own, not a job's allocation: fail within a minute rather than
                # wait behind other jobs for the nodes.
                immediate_s=60,
            )
        ]
    else:
        commands = [
            group_agent_command(
                module,
                args,
                name=name,
                nodes=nodes,
                nproc_per_node=nproc_per_node,
                node_rank=node,
                master_addr=LOOPBACK,
                port=port,
                threads_per_process=threads_per_process,
            )
            for node in range(nodes)
        ]
    return [Command(c.argv, c.env | python_path()) for c in commands]


def python_path() -> dict[str, str]:
    """What a `python -m dmls...` command needs in its environment to find the package, whatever
    the folder it starts in."""
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, (str(SCRIPTS), os.environ.get("PYTHONPATH"))))
    }


def group_agent_command(
    module: str,
    args: list[str],
    *,
    name: str,
    nodes: int,
    nproc_per_node: int,
    node_rank: int,
    master_addr: str,
    port: int,
    threads_per_process: int,
) -> Command:
    """The torchrun agent of node `node_rank` of a special study's group `name`: it starts
    `nproc_per_node` ranks of `python -m module args`; node 0 at `master_addr` hosts the
    rendezvous on `port`."""
    return torchrun_command(
        ["-m", module],
        args,
        nodes=nodes,
        nproc_per_node=nproc_per_node,
        node_rank=node_rank,
        master_addr=master_addr,
        port=port,
        rdzv_id=f"{name}.{port}",
        threads_per_process=threads_per_process,
    )


def _thread_env(threads_per_process: int) -> dict[str, str]:
    n = str(threads_per_process)
    return {"OMP_NUM_THREADS": n, "DMLS_THREADS_PER_PROCESS": n}
