"""One training process, as a launcher starts it (workflow/scripts/rank.py calls `main`).

python rank.py --spec '<json>' --data-dir results/data --run-dir results/runs/<study>/<run>
                --checkpoint results/checkpoints/<study>/<run>.pt [--gc {freeze,default}]

Rank 0 writes the run's result (every seed's) to `<run-dir>/worker.json` (protocol.RESULT); a
rank that fails writes `<run-dir>/error-rank<N>.json` (the supervisor names the first as the
run's reason).
`--gc` is the garbage collector's policy (training/collector.py; rank.py applies its first
part before its imports). Importing this module is cheap: torch and the trainer are imported by
`main`, after the process is tied to its launcher.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from dmls import protocol
from dmls.config.spec import RunSpec
from dmls.files import write_json
from dmls.training.collector import GarbageCollection


def main(imports_start: float, argv: list[str] | None = None) -> None:
    """Train the spec given on the command line; `imports_start` is when the process began
    importing (the result's `import_s` counts from it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="resolved run spec (JSON)")
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path, help="resume file")
    GarbageCollection.add_argument(parser)
    args = parser.parse_args(argv)
    # Before importing torch takes seconds: tied to its launcher (a `kill -9` of torchrun must
    # not leave it training and writing checkpoints on its own), its stacks printed when it is
    # stopped, and its error left where the supervisor names the first as the run's reason.
    with protocol.as_rank(args.run_dir):
        from dmls.training import job

        spec = RunSpec.from_json(args.spec)
        imports = time.perf_counter() - imports_start
        collector = GarbageCollection(args.gc)
        result = job.train(spec, args.data_dir, args.run_dir, args.checkpoint, collector)
        if result is not None:
            result["timing"]["import_s"] = imports
            write_json(args.run_dir / protocol.RESULT, result)
    # Leave without interpreter finalization, as multiprocessing's children do. DDP keeps the
    # gloo process group alive past destroy_process_group(), so its worker threads still run
    # while Python finalizes; one that then drops the last reference to a collective's tensor
    # needs the GIL, is told to exit (pthread_exit) inside a noexcept destructor, and the rank
    # dies by SIGABRT ("terminate called without an active exception") after its result is
    # written. Everything is written by now; an error above still exits with its traceback.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
