"""Fault drills inside the ranks: the fault `DMLS_FAULT` asks for (parsed in dmls/protocol.py,
which says the variable's format and kinds) fires halfway through its epoch, in the micro-step
`Drill` counts to."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING

from dmls.protocol import Fault

if TYPE_CHECKING:
    import torch

EXIT_CODE = 13


class InjectedFault(RuntimeError):
    """The error a `kind=raise` fault raises."""


def fire(fault: Fault, loss: torch.Tensor) -> torch.Tensor:
    """Fail as the fault's `kind` says; for `nan`, return the poisoned loss."""
    what = fault.describe()
    # The time lets a drill measure how long the failure takes to end the job.
    print(f"{what}, at unix time {time.time():.3f}", file=sys.stderr, flush=True)
    if fault.kind == "raise":
        raise InjectedFault(what)
    if fault.kind == "exit":
        os._exit(EXIT_CODE)
    if fault.kind == "kill":
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
            loss = fire(self.fault, loss)
        self.micro_steps += 1
        return loss
