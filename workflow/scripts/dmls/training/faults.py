"""Fault injection for tests and drills: make one rank fail on purpose, mid-epoch.

`DMLS_FAULT="rank=1,epoch=2,kind=kill"` (optionally `run=<study>/<run>` to hit one run only, and
`seed=<int>` to hit one seed of a run that trains several; else every seed's epoch) makes that
rank, halfway through that (1-based) epoch, do one of:

- raise: raise `InjectedFault`, as a bug in the training code would (traceback in the log);
- exit:  leave at once with exit code 13 and no Python traceback, as a crash in native code;
- kill:  SIGKILL itself, as the OOM killer would;
- nan:   turn its loss into NaN, as fp16 overflow or an absurd learning rate would.

The variable is parsed strictly: a typo is an error, never a drill that silently does nothing.
"""

from __future__ import annotations

import difflib
import os
import re
import signal
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ENV = "DMLS_FAULT"
KINDS = ("raise", "exit", "kill", "nan")
EXIT_CODE = 13
_FORMAT = "'rank=<int>,epoch=<int>,kind=raise|exit|kill|nan[,run=<study>/<run>][,seed=<int>]'"


class InjectedFault(RuntimeError):
    """The error a `kind=raise` fault raises."""


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

    def check_run_exists(self, run_ids: Collection[str]) -> None:
        """ValueError when the drill names a run the config doesn't have."""
        if self.run is not None and self.run not in run_ids:
            close = difflib.get_close_matches(self.run, run_ids, n=1)
            guess = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"{ENV} names run {self.run!r}, which is not a run of the config{guess}"
            )

    def targets(self, run_id: str) -> bool:
        return self.run in (None, run_id)

    def cannot_fire(self, processes: int, epochs: int, seeds: Sequence[int] = ()) -> str | None:
        """Why this drill can't fire in a run of `processes` ranks and `epochs` epochs (of the
        seeds `seeds`) that it targets (a drill that does nothing would pass as a run that
        survived it), or None."""
        problems = []
        if self.seed is not None and seeds and self.seed not in seeds:
            problems.append(f"seed {self.seed}, but the run trains seeds {list(seeds)}")
        if self.rank >= processes:
            problems.append(f"rank {self.rank}, but the run has ranks 0-{processes - 1}")
        if self.epoch > epochs:
            problems.append(f"epoch {self.epoch}, but the run trains {epochs} epoch(s)")
        if not problems:
            return None
        hint = "" if self.run else " (name the run it is for with run=<study>/<run>)"
        return f"{ENV} asks for " + " and ".join(problems) + hint

    def hits(self, run_id: str, rank: int, epoch: int, seed: int = 0) -> bool:
        """Whether this fault fires in run `run_id` on `rank` during (1-based) `epoch` of
        `seed`."""
        return (
            self.targets(run_id)
            and (self.rank, self.epoch) == (rank, epoch)
            and self.seed in (None, seed)
        )

    def fire(self, loss: torch.Tensor) -> torch.Tensor:
        """Fail as `kind` says; for `nan`, return the poisoned loss."""
        what = f"injected fault ({ENV}): rank {self.rank}, epoch {self.epoch}, kind {self.kind}"
        if self.seed is not None:
            what += f", seed {self.seed}"
        # The time lets a drill measure how long the failure takes to end the job.
        print(f"{what}, at unix time {time.time():.3f}", file=sys.stderr, flush=True)
        if self.kind == "raise":
            raise InjectedFault(what)
        if self.kind == "exit":
            os._exit(EXIT_CODE)
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        return loss * float("nan")


class Drill:
    """One rank's fault drill: the fault fires in the micro-step halfway through its epoch."""

    def __init__(self, fault: Fault, run_id: str, rank: int, seed: int = 0) -> None:
        self.fault, self.run_id, self.rank, self.seed = fault, run_id, rank, seed
        self.due: int | None = None  # the micro-step of this epoch that fires, if any
        self.micro_steps = 0

    @classmethod
    def from_env(cls, run_id: str, rank: int, seed: int = 0) -> Drill | None:
        """The drill `DMLS_FAULT` asks of run `run_id`'s seed `seed`, None when it asks none."""
        fault = Fault.from_env()
        if fault is None or not fault.targets(run_id) or fault.seed not in (None, seed):
            return None
        return cls(fault, run_id, rank, seed)

    def start_epoch(self, epoch: int, micro_steps: int) -> None:
        """A new (1-based) epoch of `micro_steps` micro-steps begins."""
        hits = self.fault.hits(self.run_id, self.rank, epoch, self.seed)
        self.due, self.micro_steps = (micro_steps // 2 if hits else None), 0

    def __call__(self, loss: torch.Tensor) -> torch.Tensor:
        """The micro-step's loss, or what the fault makes of it when this is its step."""
        if self.micro_steps == self.due:
            loss = self.fault.fire(loss)
        self.micro_steps += 1
        return loss
