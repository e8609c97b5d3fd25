"""How a special study that needs several processes (the collectives sweep, D4) starts them:
as a training run's ranks are started. supervisor/launch.py builds the commands (a torchrun
agent per emulated node, or an srun step), supervisor/processes.py runs them: one rank failing
stops the others, a group still running at the timeout is stopped, and the failure names the
rank and what it raised, with the supervisor's reason for a failed training run.

Each rank runs its body inside `protocol.as_rank(<folder>)`, which leaves its error there.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from dmls import protocol
from dmls.supervisor import launch, processes

# Longer than any sweep or D4 setup takes; what outlives it hangs (a collective a peer never
# joins).
TIMEOUT_S = 1800
LOG = "ranks.log"


class RanksFailed(RuntimeError):
    """A group of ranks failed or hung; the message says which rank and what it raised."""


def run(
    module: str,
    args: list[str],
    *,
    name: str,
    folder: Path,
    nproc_per_node: int,
    nodes: int = 1,
    srun: bool = False,
    timeout_s: float = TIMEOUT_S,
) -> None:
    """Start `nodes` × `nproc_per_node` ranks of `python -m module args` (launch.group_commands;
    `name` names their rendezvous) and wait for them. Their output goes to `<folder>/ranks.log`
    and their error reports into `folder`, which is removed when every rank succeeded (and its
    parent, when nothing else is left there). Raises RanksFailed when one failed or the group
    ran past `timeout_s`; the folder then stays."""
    folder.mkdir(parents=True, exist_ok=True)
    protocol.clear_reports(folder)  # an earlier attempt's
    commands = launch.group_commands(
        module,
        args,
        nodes=nodes,
        nproc_per_node=nproc_per_node,
        port=launch.free_port(),
        name=name,
        srun=srun,
    )
    log_path = folder / LOG
    with open(log_path, "w") as log:
        outcome = processes.start_and_wait(commands, log, timeout_s=timeout_s)
    if outcome.timed_out:
        raise RanksFailed(
            f"still running after {timeout_s:g} s, so every rank was stopped (a hung "
            f"collective?); their output is in {log_path}"
        )
    if not outcome.ok:
        output = log_path.read_text(errors="replace")
        reason = processes.failure_reason(folder, outcome.exit_codes, output, LOG)
        raise RanksFailed(f"{reason} (their output is in {log_path})")
    shutil.rmtree(folder)
    with contextlib.suppress(OSError):  # other groups' folders are left there
        folder.parent.rmdir()
