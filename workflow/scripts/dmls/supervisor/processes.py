"""Running launcher commands (supervisor/launch.py builds them): a training run's and a special
study's ranks are started, waited for and stopped here, and only here.

Each command starts in a process group of its own, so it can be stopped whole, and dies with
the process that started it. When one fails, the others are stopped (SIGTERM to their groups,
SIGKILL after `STOP_GRACE_S`) rather than left waiting for a peer that is gone; past the
timeout, all are. The ranks' side (`as_rank`, the error reports `failure_reason` reads) is
dmls/protocol.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from dmls.protocol import die_with_parent, error_reports
from dmls.supervisor.launch import Command

# How gloo and NCCL report a peer that died or went silent: the error of a rank that lost a
# peer, which is a consequence of the failure, not its cause.
LOST_PEER = re.compile(r"closed by peer|reset by peer|broken pipe|timed out|timeout", re.I)
# How torchrun and accelerate launch (torch.distributed.elastic) list a failed rank in the
# summary that ends their output: "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: …".
ELASTIC_FAILURE = re.compile(
    r"^\s*rank\s*: (\d+) \(local_rank: \d+\)\n\s*exitcode\s*: (-?\d+)", re.M
)
# srun's own errors ("srun: error: Only allocated 1 nodes asked for 2"), as opposed to the
# lines in which it reports a task's exit ("srun: error: node2: task 1: Exited with exit code
# 1"): that is a rank's failure, which the ranks' reports and the launcher's summary explain.
SRUN_ERROR = re.compile(r"^srun: (?:error|fatal): (.+?)\s*$", re.M)
SRUN_TASK_EXIT = re.compile(r"^\S+: tasks? [\d,-]+: ")
# srun could not start a step's task on a node (its slurmd gone as the job started): the node
# failed, not the run. "Task launch for StepId=184.0 failed on node node2: Communication
# connection failure"
LAUNCH_FAILED = re.compile(r"Task launch for StepId=\S+ failed on node ([^\s:]+):")
# How long a launcher told to stop (SIGTERM) gets to stop its ranks before it is killed.
STOP_GRACE_S = 15
POLL_S = 0.2
# How often a job still running says so in the terminal (`heartbeat`, dmls.joblog.heartbeat).
HEARTBEAT_S = 60.0


@dataclass(frozen=True)
class Outcome:
    """How the commands ended."""

    exit_codes: list[int]  # one per command, negative: killed by that signal
    seconds: float
    # The exit code of the first command that failed, None if none did. A command stopped
    # because another failed, or because of the timeout, did not fail.
    first_failure: int | None
    timed_out: bool = False  # every command was stopped at the timeout

    @property
    def ok(self) -> bool:
        return not self.timed_out and not any(self.exit_codes)


def start_and_wait(
    commands: list[Command],
    log: IO[str],
    *,
    env: Mapping[str, str] | None = None,
    in_child: Callable[[], None] | None = None,
    timeout_s: float | None = None,
    heartbeat: Callable[[float], None] | None = None,
    heartbeat_s: float = HEARTBEAT_S,
) -> Outcome:
    """Start every command, its output into `log` (a file), and wait for all. Each runs with
    this process's environment, the command's variables and `env`, and calls `in_child` (if
    any) before it starts. If one fails, the others are stopped; past `timeout_s` (None: no
    limit), every one is, and the log says so. While they run, `heartbeat` (if any) is called
    every `heartbeat_s` seconds with the seconds so far (a long job's progress in the
    terminal)."""
    start = time.perf_counter()
    next_beat = heartbeat_s
    procs = []
    for command in commands:
        # Quoted as a shell would need it, so the line can be pasted; nothing runs in a shell.
        print("$ " + shlex.join(command.argv), file=log, flush=True)
        procs.append(
            subprocess.Popen(
                command.argv,
                env=os.environ | command.env | dict(env or {}),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so it can be stopped whole
                preexec_fn=lambda: _in_child(in_child),
            )
        )
    first_failure, timed_out = None, False
    while None in (codes := [proc.poll() for proc in procs]):
        failed = [c for c in codes if c not in (None, 0)]
        if failed and first_failure is None:
            first_failure = failed[0]
            stop([proc for proc, code in zip(procs, codes, strict=True) if code is None])
        elif timeout_s is not None and time.perf_counter() - start > timeout_s:
            timed_out = True
            print(
                f"TIMED OUT: still running after {timeout_s:g} s; every launcher is stopped",
                file=log,
                flush=True,
            )
            stop([proc for proc, code in zip(procs, codes, strict=True) if code is None])
        if heartbeat is not None and (so_far := time.perf_counter() - start) >= next_beat:
            heartbeat(so_far)
            next_beat = so_far + heartbeat_s
        time.sleep(POLL_S)
    if first_failure is None and not timed_out:
        first_failure = next((c for c in codes if c != 0), None)
    done = cast("list[int]", codes)  # the loop ends once no code is None
    return Outcome([int(c) for c in done], time.perf_counter() - start, first_failure, timed_out)


def _in_child(then: Callable[[], None] | None) -> None:
    # If the process that started it dies (its job is cancelled), the launcher stops too.
    die_with_parent(signal.SIGTERM)
    if then is not None:
        then()


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each process group; SIGKILL what is left after `STOP_GRACE_S`."""

    def signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # the group ended meanwhile
            os.killpg(proc.pid, sig)

    for proc in procs:
        signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()


def failure_reason(
    reports_dir: Path, exit_codes: list[int], launcher_output: str, log_name: str
) -> str:
    """The cause, not its consequences: when one rank fails, its peers fail too (a lost
    connection, a timeout) or are stopped by the launcher (SIGTERM) without a word. The ranks'
    reports are in `reports_dir`; `launcher_output` is the log named `log_name`."""
    reports = error_reports(reports_dir)
    causes = [r for r in reports if not LOST_PEER.search(r["error"])]
    if causes:
        return f"rank {causes[0]['rank']} raised {causes[0]['error']}"
    then = f"; then rank {reports[0]['rank']} raised {reports[0]['error']}" if reports else ""
    # A rank killed by a signal or crashed in native code leaves no report: the launcher's
    # summary says how it ended.
    silent = {
        rank: code
        for rank, code in elastic_exit_codes(launcher_output).items()
        if rank not in {r["rank"] for r in reports} and code != -signal.SIGTERM
    }
    if silent:
        rank, code = min(silent.items())
        how = (
            f"was killed by {signal.Signals(-code).name}"
            if code < 0
            else f"exited with code {code}"
        )
        return f"rank {rank} {how} without a Python error (see the end of {log_name}){then}"
    # srun's own error: a step it could not create or start (a node lost, too few nodes in
    # the allocation), or a node that failed under it. Its peers' lost connections follow.
    if errors := srun_errors(launcher_output):
        return f"srun: {errors[0]}{then}"
    if reports:
        return f"rank {reports[0]['rank']} raised {reports[0]['error']}"
    # SIGTERM with no failure before it: the launcher stops peers only after a failure, so the
    # signal came from outside the run (a user, a scheduler's time limit).
    if stopped := sorted(
        r for r, c in elastic_exit_codes(launcher_output).items() if c == -signal.SIGTERM
    ):
        ranks = f"rank{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))}"
        return (
            f"{ranks} stopped by SIGTERM from outside the run (no rank failed before it; see "
            f"the end of {log_name})"
        )
    if signalled := [c for c in exit_codes if c < 0]:  # (a launcher or lone rank killed)
        name = signal.Signals(-signalled[0]).name
        return f"the process was killed by {name}, no rank reporting an error (see {log_name})"
    if any(exit_codes):
        return f"launcher exited with codes {exit_codes} and no rank reported an error (see log)"
    return "every process exited 0 but rank 0 wrote no result (see log)"


def elastic_exit_codes(launcher_output: str) -> dict[int, int]:
    """rank -> exit code of each failed rank in the summary torchrun and accelerate launch
    (torch.distributed.elastic) print when a rank fails."""
    codes: dict[int, int] = {}
    for rank, code in ELASTIC_FAILURE.findall(launcher_output):
        codes.setdefault(int(rank), int(code))
    return codes


def srun_errors(launcher_output: str) -> list[str]:
    """srun's own error messages in `launcher_output`, first first, each once; not the lines
    in which it reports a task's exit (a rank's failure, explained by the ranks)."""
    errors = [e for e in SRUN_ERROR.findall(launcher_output) if not SRUN_TASK_EXIT.match(e)]
    return list(dict.fromkeys(errors))


def launch_failure(launcher_output: str) -> str | None:
    """Where srun could not start a step's task because a node failed (its slurmd gone as the
    job started), naming the node and srun's message; None when no launch failed."""
    for error in srun_errors(launcher_output):
        if match := LAUNCH_FAILED.search(error):
            return f"srun could not start a task on node {match[1]} (srun: {error})"
    return None
