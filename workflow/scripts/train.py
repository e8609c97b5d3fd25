"""Entry point of one training process, started by a launcher (supervisor/launch.py builds the
command): dmls/training/worker.py says what it takes and writes. Its output is the run's log,
which the supervisor streams into the `train` rule's log file."""

import gc
import time

IMPORTS_START = time.perf_counter()  # before torch and the trainer are imported
# No garbage collection while the process imports and sets up: importing torch, torch._dynamo
# and the engine creates about half a million long-lived objects (514,000, torch 2.14), and
# each full collection walks them all again (0.5 of 2.6 s of these imports on a 2-core CPU).
# trainer.train freezes what the setup built and turns the collector on before the first seed
# trains.
gc.disable()

from dmls.training import worker  # noqa: E402 (after the clock starts)

worker.main(IMPORTS_START)
