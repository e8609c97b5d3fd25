"""Entry point of one training process, started by a launcher (supervisor/launch.py builds the
command): dmls/training/worker.py says what it takes and writes. Its output is the run's log,
which the supervisor streams into the `train` rule's log file."""

import time

IMPORTS_START = time.perf_counter()  # before torch and the trainer are imported

from dmls.training import worker  # noqa: E402 (after the clock starts)

worker.main(IMPORTS_START)
