"""What a training process does with Python's garbage collector: one setting, the worker's `--gc`.

Importing torch, torch._dynamo and the engine builds about half a million long-lived objects,
and each full collection walks them all again (0.5 of 2.6 s of these imports on a 2-core CPU).
Stdlib only: rank.py applies the setting before it imports anything else.
"""

from __future__ import annotations

import argparse
import gc
from typing import ClassVar


class GarbageCollection:
    """The collector's policy in one process, by `mode`:

    - "freeze": the collector is off while the process imports and sets up (`before_imports`);
      before the first seed trains, what that built is frozen out of its reach and it is turned
      on (`before_training`), so a full collection during training (and the job's before each
      seed) walks only what training allocates.
    - "default": Python's collector as it is.
    """

    MODES: ClassVar[tuple[str, ...]] = ("freeze", "default")

    def __init__(self, mode: str = "freeze") -> None:
        if mode not in self.MODES:
            raise ValueError(f"garbage collection mode {mode!r}: one of {', '.join(self.MODES)}")
        self.mode = mode

    @classmethod
    def add_argument(cls, parser: argparse.ArgumentParser) -> None:
        """The command-line option that sets the mode, `--gc {freeze,default}`."""
        parser.add_argument(
            "--gc",
            choices=cls.MODES,
            default="freeze",
            help="garbage collector: frozen after setup (freeze, the default) or Python's own",
        )

    @classmethod
    def from_argv(cls, argv: list[str]) -> GarbageCollection:
        """The policy `--gc` asks for on a command line, read before any other argument is
        parsed (an invalid mode exits with argparse's message)."""
        parser = argparse.ArgumentParser(add_help=False)
        cls.add_argument(parser)
        return cls(parser.parse_known_args(argv)[0].gc)

    def before_imports(self) -> None:
        """At the process's start, before torch and the engine are imported."""
        if self.mode == "freeze":
            gc.disable()

    def before_training(self) -> None:
        """Before the first seed's trainer is built, so that every seed's objects are still
        collected. torch._dynamo is imported first: the first optimizer and DDP's constructor
        import it, and it is most of the long-lived objects. Where the collector is on (a caller
        that kept it on: tests, benches calling `job.train`), it is left as it is."""
        if self.mode != "freeze" or gc.isenabled():
            return
        import torch._dynamo  # noqa: F401

        gc.freeze()
        gc.enable()
