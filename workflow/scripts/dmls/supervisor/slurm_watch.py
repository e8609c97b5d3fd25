"""What Slurm says of this workflow's jobs and their nodes, in the terminal of the Snakemake that
submitted them (`--profile profiles/slurm`).

Under Slurm a job's own heartbeat (dmls.joblog.heartbeat) goes to its Slurm log, and Snakemake
prints nothing until a status check sees a job end: a node lost at launch was first said 6 min
30 s later ("Detailed failure reason unavailable"), a job stuck COMPLETING on a lost node for
minutes without a word. `Watch` asks Slurm every `period` seconds (`squeue` for the jobs,
`sinfo` for the nodes) and prints one line: what runs, waits (with Slurm's reason) and ended,
and, as soon as it is seen, each node of the jobs that Slurm says is down, drained or not
responding (`*`), with Slurm's reason, and each job that sits COMPLETING. `closing` gives the
lines the DAG's last words add: each job that did not end COMPLETED, and each node problem
seen, with its reason and time.

The jobs are this workflow's: the Slurm plugin's job name (its run id) where Snakemake exposes
it, else jobs of this user and directory submitted since the workflow started. Standard library
only; nothing here is a cause of our own: every state and reason is Slurm's.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# How often the terminal hears from Slurm (env DMLS_SLURM_WATCH_S overrides it: the drills).
PERIOD_S = 60.0
# squeue's fields: job id, name, comment (the plugin's rule_<rule>_wildcards_<...>), state,
# time used, node list, reason, working directory, submit time.
SQUEUE_FORMAT = "%i|%j|%k|%T|%M|%N|%r|%Z|%V"
# Ends that are not a success (squeue keeps ended jobs for MinJobAge seconds).
BAD_ENDS = ("FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "CANCELLED", "BOOT_FAIL",
            "PREEMPTED", "DEADLINE")  # fmt: skip
LIVE = ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED")


def _run(argv: Sequence[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


@dataclass
class Job:
    """A job as squeue last showed it, and since when (this watch's clock) in that state."""

    job_id: str
    what: str  # "train cluster_torchrun_n2xp1"
    state: str
    used: str
    nodes: str
    reason: str
    since: str = ""


@dataclass
class NodeProblem:
    node: str
    state: str  # sinfo's, "down*", "idle*" (*: not responding), "drained"
    reason: str
    since: str  # when this watch first saw it


@dataclass
class Watch:
    """This workflow's Slurm jobs and their nodes, polled (`poll`) every `period` seconds by a
    daemon thread (`start`), each poll's lines handed to `say`."""

    workdir: str
    started: float  # epoch seconds: a job submitted before is another workflow's
    run_id: str | None = None
    period: float = PERIOD_S
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
    run: Callable[[Sequence[str]], str] = field(default_factory=lambda: _run)
    # Where the plugin keeps each job's Slurm log (`--slurm-logdir`): a failed job's is read
    # for the reason the job itself gave (the supervisor's INTERRUPTED line names a lost node).
    logdir: Path | None = None
    jobs: dict[str, Job] = field(default_factory=dict)
    problems: dict[str, NodeProblem] = field(default_factory=dict)
    # Per job seen COMPLETING: its nodes, and the first and last poll that saw it so.
    completing: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        def loop() -> None:
            while not self._stop.wait(self.period):
                for line in self.poll():
                    self.say(line)

        thread = threading.Thread(target=loop, name="slurm-watch", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def poll(self) -> list[str]:
        """Ask Slurm once; the lines for the terminal (none where Slurm can't be asked)."""
        stamp = time.strftime("%H:%M:%S")
        try:
            queue = self.run(["squeue", "--noheader", "--states=all", "--format", SQUEUE_FORMAT])
            nodes = self.run(["sinfo", "--noheader", "--Node", "--format", "%N|%T|%E"])
        except (OSError, subprocess.SubprocessError) as e:
            return [f"[{stamp}] Slurm: can't be asked ({e})"]
        ended, completing = [], []
        for job in self._ours(queue):
            old = self.jobs.get(job.job_id)
            job.since = old.since if old and old.state == job.state else stamp
            self.jobs[job.job_id] = job
            if job.state in BAD_ENDS and (old is None or old.state != job.state):
                ended.append(job)
            if job.state == "COMPLETING":
                completing.append(job)
                first = self.completing.get(job.job_id, (job.nodes, stamp, stamp))[1]
                self.completing[job.job_id] = (job.nodes, first, stamp)
        lines = [f"[{stamp}] Slurm: {self._summary()}"]
        busy = {n for j in self.jobs.values() if j.state in LIVE or j in ended for n in _nodes(j)}
        for node, state, reason in (row.split("|", 2) for row in nodes.splitlines() if row):
            if node in busy and _bad(state):
                new = node not in self.problems or self.problems[node].state != state
                if new:  # (since: when its first problem was seen)
                    since = self.problems[node].since if node in self.problems else stamp
                    self.problems[node] = NodeProblem(node, state, reason, since)
                    on = [
                        f"job {j.job_id} ({j.what})"
                        for j in self.jobs.values()
                        if node in _nodes(j) and j.state in LIVE
                    ]
                    lines.append(
                        f"[{stamp}] Slurm: node {node} is {_state_words(state)}{_why(reason)}"
                        + (f"; {', '.join(on)} on it" if on else "")
                    )
        for job in ended:
            lines.append(
                f"[{stamp}] Slurm: job {job.job_id} ({job.what}) ended {job.state} on "
                f"{job.nodes or 'no node'}{_why(job.reason)}"
            )
        for job in completing:
            lines.append(
                f"[{stamp}] Slurm: job {job.job_id} ({job.what}) COMPLETING since {job.since} on "
                f"{job.nodes}: its processes ended and Slurm is still cleaning up on its nodes"
            )
        return lines

    def closing(self) -> list[str]:
        """For the DAG's last lines: each job that did not end COMPLETED (as Slurm last showed
        it), and each node problem seen while this workflow's jobs were on it."""
        self.poll()
        lines = []
        for job in self.jobs.values():
            if job.state in BAD_ENDS:
                lines.append(
                    f"  job {job.job_id} ({job.what}): {job.state} on {job.nodes or 'no node'}"
                    f"{_why(job.reason)}{self._said(job.job_id)}"
                )
        for job_id, (nodes, first, last) in self.completing.items():
            job = self.jobs[job_id]
            then = "" if job.state == "COMPLETING" else f", then {job.state}"
            lines.append(
                f"  job {job_id} ({job.what}): COMPLETING on {nodes} from {first} to {last} (as "
                f"polled){then}"
            )
        for p in self.problems.values():
            lines.append(f"  node {p.node}: {_state_words(p.state)} from {p.since}{_why(p.reason)}")
        return ["Slurm:", *lines] if lines else []

    def _said(self, job_id: str) -> str:
        """What the job's own log says of why it stopped (the supervisor's RunInterrupted, or
        its INTERRUPTED line), where the log is kept; empty otherwise."""
        if self.logdir is None:
            return ""
        for log in Path(self.logdir).glob(f"**/{job_id}.log"):
            text = log.read_text(errors="replace")
            said = [
                line.split("RunInterrupted: ")[-1].strip()
                for line in text.splitlines()
                if "RunInterrupted: " in line or line.startswith("INTERRUPTED ")
            ]
            if said:
                return f"; its log ({log}): {said[-1][:400]}"
        return ""

    def _ours(self, queue: str) -> list[Job]:
        found = []
        for row in queue.splitlines():
            parts = row.split("|")
            if len(parts) != 9:
                continue
            job_id, name, comment, state, used, nodes, reason, workdir, submitted = parts
            if not comment.startswith("rule_"):
                continue
            if self.run_id is not None:
                if name != self.run_id:
                    continue
            elif workdir != self.workdir or _epoch(submitted) < self.started - 1:
                continue
            what = comment.removeprefix("rule_").replace("_wildcards_", " ", 1)
            found.append(Job(job_id, what, state, used, nodes, reason))
        return found

    def _summary(self) -> str:
        by_state: dict[str, list[Job]] = {}
        for job in self.jobs.values():
            by_state.setdefault(job.state, []).append(job)
        parts = []
        for state in ("RUNNING", "COMPLETING", "PENDING", *BAD_ENDS, "COMPLETED"):
            jobs = by_state.get(state, [])
            if not jobs:
                continue
            text = f"{len(jobs)} {state.lower()}"
            if state == "RUNNING":
                shown = [f"{j.what} {j.used} on {j.nodes}" for j in jobs[:3]]
                text += f" ({'; '.join(shown)}{'; …' if len(jobs) > 3 else ''})"
            elif state == "PENDING":
                reasons = sorted({j.reason for j in jobs if _why(j.reason)})
                text += _why(", ".join(reasons))
            parts.append(text)
        return ", ".join(parts) or "no job of this workflow in the queue"


def _why(reason: str) -> str:
    """Slurm's reason in brackets, nothing where it gives none ("None", "none")."""
    return (
        "" if reason.strip().lower() in ("", "none", "(null)") else f" (Slurm's reason: {reason})"
    )


def _bad(state: str) -> bool:
    """A node Slurm says is not responding (`*`), down, drained, draining or failing."""
    return state.endswith("*") or state.rstrip("*~#!%$@^-").startswith(
        ("down", "drain", "fail", "unknown")
    )


def _state_words(state: str) -> str:
    words = "not responding" if state.endswith("*") else ""
    base = state.rstrip("*~#!%$@^-")
    if base.startswith(("down", "drain", "fail")):
        words = f"{base}{', not responding' if words else ''}"
    return f"{words or base} ({state})"


def _nodes(job: Job) -> set[str]:
    return set(expand(job.nodes)) if job.nodes and job.nodes != "(null)" else set()


def expand(hostlist: str) -> list[str]:
    """`node[1-2],gpu7` → node1, node2, gpu7 (Slurm's host list, without asking Slurm)."""
    out: list[str] = []
    depth, part = 0, ""
    pieces = []
    for ch in hostlist:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            pieces.append(part)
            part = ""
        else:
            part += ch
    pieces.append(part)
    for piece in filter(None, pieces):
        if "[" not in piece:
            out.append(piece)
            continue
        prefix, _, rest = piece.partition("[")
        ranges, _, suffix = rest.partition("]")
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            width = len(low)
            for n in range(int(low), int(high or low) + 1):
                out.append(f"{prefix}{n:0{width}d}{suffix}")
    return out


def _epoch(stamp: str) -> float:
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return 0.0


# The watch of this Snakemake (started by the onstart hook under Slurm), for the last lines.
WATCH: Watch | None = None
