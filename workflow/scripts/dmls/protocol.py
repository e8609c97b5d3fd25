"""The ranks' side of the protocol between the supervisor that starts a group of processes and
the ranks in it, below both: supervisor/ (which starts, waits for and names what failed) and
training/ and special/ (whose ranks run inside `as_rank`) import it; it imports neither.

- `as_rank`: what a rank does first (it dies with its launcher and prints its stacks when
  stopped) and the error report it leaves, `error-rank<N>.json`, read back by `error_reports`;
- `RESULT`: the file rank 0 of a training run hands its result in (training/worker.py writes,
  supervisor/supervise.py reads);
- `die_with_parent`: no launcher or rank outlives the process that started it;
- `Fault`: the fault drill `DMLS_FAULT` asks for, parsed strictly (a typo is an error, never a
  drill that silently does nothing), so the supervisor and Snakemake's parse refuse one that
  can't fire before any rank starts; training/faults.py makes it fire.

`DMLS_FAULT="rank=1,epoch=2,kind=kill"` (optionally `run=<study>/<run>` to hit one run only, and
`seed=<int>` to hit one seed of a run that trains several; else every seed's epoch) makes that
rank, halfway through that (1-based) epoch, do one of:

- raise: raise `InjectedFault`, as a bug in the training code would (traceback in the log);
- exit:  leave at once with exit code 13 and no Python traceback, as a crash in native code;
- kill:  SIGKILL itself, as the OOM killer would;
- nan:   turn its loss into NaN, as fp16 overflow or an absurd learning rate would.
"""

from __future__ import annotations

import contextlib
import ctypes
import difflib
import errno
import faulthandler
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmls.files import read_json, write_json

# The file rank 0 of a training run leaves its result in, in the run's folder.
RESULT = "worker.json"
ERROR_REPORTS = "error-rank*.json"

ENV = "DMLS_FAULT"
KINDS = ("raise", "exit", "kill", "nan")
_FORMAT = "'rank=<int>,epoch=<int>,kind=raise|exit|kill|nan[,run=<study>/<run>][,seed=<int>]'"


def die_with_parent(sig: signal.Signals) -> None:
    """Ask Linux to send this process `sig` when its parent dies (prctl PR_SET_PDEATHSIG), so
    no launcher or rank outlives the process that started it. Elsewhere it does nothing."""
    if sys.platform != "linux":
        return
    PR_SET_PDEATHSIG = 1
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig)) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


@contextlib.contextmanager
def as_rank(reports: Path) -> Iterator[int]:
    """Run the body as a rank that a launcher started: it dies with its launcher, prints every
    thread's stack when stopped (SIGTERM), and an error it raises is written to
    `<reports>/error-rank<N>.json` before it propagates. Yields the rank (torchrun's RANK; 0 in a
    process started alone)."""
    # A rank must not outlive its launcher (a `kill -9` of torchrun would leave it running).
    die_with_parent(signal.SIGKILL)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    rank = int(os.environ.get("RANK", "0"))
    try:
        yield rank
    except BaseException as exc:
        write_json(
            reports / f"error-rank{rank}.json",
            {
                "rank": rank,
                "time": time.time(),
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
                # No result, yet nothing wrong with the run: a rerun resumes (a full disk).
                "resumable": getattr(exc, "resumable", False)
                or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC),
            },
        )
        raise


def error_reports(folder: Path) -> list[dict[str, Any]]:
    """The errors the ranks reported (`as_rank`'s error-rank<N>.json), first first."""
    return sorted((read_json(p) for p in folder.glob(ERROR_REPORTS)), key=lambda r: r["time"])


def clear_reports(folder: Path) -> None:
    """Remove what an earlier attempt's ranks left in `folder` (error reports, a result)."""
    for left in [*folder.glob(ERROR_REPORTS), folder / RESULT]:
        left.unlink(missing_ok=True)


@dataclass(frozen=True)
class Fault:
    rank: int
    epoch: int
    kind: str
    run: str | None = None
    seed: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Fault | None:
        """The fault `DMLS_FAULT` asks for, None when unset; ValueError naming what is wrong."""
        text = environ.get(ENV, "").strip()
        if not text:
            return None

        def bad(problem: str) -> ValueError:
            return ValueError(f"{ENV}={text!r}: {problem}; expected {_FORMAT}")

        fields: dict[str, str] = {}
        for item in text.split(","):
            key, sep, value = (part.strip() for part in item.partition("="))
            if not sep or not value:
                raise bad(f"{item.strip()!r} is not key=value")
            if key not in ("rank", "epoch", "kind", "run", "seed"):
                raise bad(f"unknown key {key!r}")
            if key in fields:
                raise bad(f"{key!r} given twice")
            fields[key] = value
        missing = [k for k in ("rank", "epoch", "kind") if k not in fields]
        if missing:
            raise bad(f"missing {', '.join(map(repr, missing))}")
        for key, minimum in (("rank", 0), ("epoch", 1), ("seed", 0)):
            if key not in fields:
                continue
            if not re.fullmatch(r"\d+", fields[key]) or int(fields[key]) < minimum:
                raise bad(f"{key} must be an integer >= {minimum}, got {fields[key]!r}")
        if fields["kind"] not in KINDS:
            raise bad(f"kind must be one of {', '.join(KINDS)}, got {fields['kind']!r}")
        seed = int(fields["seed"]) if "seed" in fields else None
        return cls(
            int(fields["rank"]), int(fields["epoch"]), fields["kind"], fields.get("run"), seed
        )

    def check_run_exists(self, runs: Collection[str] | Mapping[str, Any]) -> None:
        """ValueError when the drill names a run the config doesn't have; given the runs' specs
        ({run id: RunSpec}, as Snakemake passes them before any job), also when it can't fire
        in a run it targets, naming every such run and why (`cannot_fire`, which the
        supervisor asks again in the job)."""
        if self.run is not None and self.run not in runs:
            close = difflib.get_close_matches(self.run, runs, n=1)
            guess = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"{ENV} names run {self.run!r}, which is not a run of the config{guess}"
            )
        if not isinstance(runs, Mapping):
            return
        lines = []
        for run_id, spec in runs.items():
            seeds = range(spec.seed, spec.seed + spec.seeds)
            if self.targets(run_id) and (lacks := self._lacks(spec.processes, spec.epochs, seeds)):
                lines.append(f"{run_id}: {' and '.join(lacks)}")
        if lines:
            hint = "" if self.run else "; name the run it is for with run=<study>/<run>"
            raise ValueError(
                f"{ENV} ({self._asked()}) can't fire in {len(lines)} run(s) it targets "
                "(a drill that does nothing would pass as a run that survived it)"
                f"{hint}:\n  " + "\n  ".join(lines)
            )

    def _asked(self) -> str:
        asked = f"rank={self.rank},epoch={self.epoch},kind={self.kind}"
        return asked if self.seed is None else f"{asked},seed={self.seed}"

    def targets(self, run_id: str) -> bool:
        return self.run in (None, run_id)

    def cannot_fire(self, processes: int, epochs: int, seeds: Sequence[int] = ()) -> str | None:
        """Why this drill can't fire in a run of `processes` ranks and `epochs` epochs (of the
        seeds `seeds`) that it targets (a drill that does nothing would pass as a run that
        survived it), or None."""
        problems = self._lacks(processes, epochs, seeds)
        if not problems:
            return None
        hint = "" if self.run else " (name the run it is for with run=<study>/<run>)"
        return f"{ENV} asks for " + " and ".join(problems) + hint

    def _lacks(self, processes: int, epochs: int, seeds: Sequence[int]) -> list[str]:
        """What the drill asks for that a run of `processes` ranks, `epochs` epochs and seeds
        `seeds` (unchecked when empty) lacks."""
        problems = []
        if self.seed is not None and seeds and self.seed not in seeds:
            problems.append(f"seed {self.seed}, but the run trains seeds {list(seeds)}")
        if self.rank >= processes:
            problems.append(f"rank {self.rank}, but the run has ranks 0-{processes - 1}")
        if self.epoch > epochs:
            problems.append(f"epoch {self.epoch}, but the run trains {epochs} epoch(s)")
        return problems

    def hits(self, run_id: str, rank: int, epoch: int, seed: int = 0) -> bool:
        """Whether this fault fires in run `run_id` on `rank` during (1-based) `epoch` of
        `seed`."""
        return (
            self.targets(run_id)
            and (self.rank, self.epoch) == (rank, epoch)
            and self.seed in (None, seed)
        )

    def describe(self) -> str:
        """The drill in words, as the rank that fires it prints it."""
        what = f"injected fault ({ENV}): rank {self.rank}, epoch {self.epoch}, kind {self.kind}"
        return what if self.seed is None else f"{what}, seed {self.seed}"
