"""Entry point of one training process, started by a launcher (supervisor/launch.py builds the
command): dmls/training/worker.py says what it takes and writes. Its output is the run's log,
which the supervisor streams into the `train` rule's log file."""

import sys
import time

IMPORTS_START = time.perf_counter()  # before torch and the trainer are imported

# The garbage collector's policy (`--gc`) applies before the imports it is about.
from dmls.training.collector import GarbageCollection  # noqa: E402 (stdlib only)

GarbageCollection.from_argv(sys.argv[1:]).before_imports()

from dmls.training import worker  # noqa: E402 (after the collector's policy)

worker.main(IMPORTS_START)
