"""One training process, as a launcher starts it (workflow/scripts/train.py calls `main`).

python train.py --spec '<json>' --data-dir results/data --run-dir results/runs/<study>/<run>
                --checkpoint results/checkpoints/<study>/<run>.pt [--gc {freeze,default}]

Rank 0 writes the run's result (every seed's) to `<run-dir>/worker.json`; a rank that fails writes
`<run-dir>/error-rank<N>.json` (the supervisor names the first as the run's reason).
`--gc` is the garbage collector's policy (training/collector.py; train.py applies its first
part before its imports). Importing this module is cheap: torch and the trainer are imported by
`main`, after the process is tied to its launcher.
"""

from __future__ import annotations

import argparse
import errno
import faulthandler
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from dmls.config.spec import RunSpec
from dmls.files import write_json
from dmls.supervisor.launch import die_with_parent
from dmls.training.collector import GarbageCollection


def main(imports_start: float, argv: list[str] | None = None) -> None:
    """Train the spec given on the command line; `imports_start` is when the process began
    importing (the result's `import_s` counts from it)."""
    # First, before importing torch takes seconds: a rank must not outlive its launcher (a
    # `kill -9` of torchrun would leave it training, and writing checkpoints, on its own).
    die_with_parent(signal.SIGKILL)
    # A rank stopped from outside (the launcher passes SIGTERM on) first writes where each of
    # its threads was, so the log of a run that hung says where.
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    from dmls.training import job

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="resolved run spec (JSON)")
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path, help="resume file")
    GarbageCollection.add_argument(parser)
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    try:
        spec = RunSpec.from_json(args.spec)
        imports = time.perf_counter() - imports_start
        collector = GarbageCollection(args.gc)
        result = job.train(spec, args.data_dir, args.run_dir, args.checkpoint, collector)
        if result is not None:
            result["timing"]["import_s"] = imports
            write_json(args.run_dir / "worker.json", result)
    except BaseException as exc:
        # The supervisor names the rank whose error came first as the run's reason; the full
        # traceback goes to the log.
        write_json(
            args.run_dir / f"error-rank{rank}.json",
            {
                "rank": int(rank),
                "time": time.time(),
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
                # No result, yet nothing wrong with the run: a rerun resumes (a full disk).
                "resumable": getattr(exc, "resumable", False)
                or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC),
            },
        )
        raise
    # Leave without interpreter finalization, as multiprocessing's children do. DDP keeps the
    # gloo process group alive past destroy_process_group(), so its worker threads still run
    # while Python finalizes; one that then drops the last reference to a collective's tensor
    # needs the GIL, is told to exit (pthread_exit) inside a noexcept destructor, and the rank
    # dies by SIGABRT ("terminate called without an active exception") after its result is
    # written. Everything is written by now; an error above still exits with its traceback.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
