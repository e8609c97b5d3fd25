"""Worker entry point: one training process, started by a launcher (see dmls/supervisor/launch.py).

python train.py --spec '<json>' --data-dir results/data --run-dir results/runs/<study>/<run>
                --checkpoint results/checkpoints/<study>/<run>.pt
"""

import argparse
import faulthandler
import os
import signal
import sys
import time
import traceback
from pathlib import Path

IMPORTS_START = time.perf_counter()  # before torch and the engine are imported

from dmls.supervisor.launch import die_with_parent  # noqa: E402

# First, before importing torch takes seconds: a rank must not outlive its launcher (a
# `kill -9` of torchrun would leave it training, and writing checkpoints, on its own).
die_with_parent(signal.SIGKILL)
# A rank stopped from outside (the launcher passes SIGTERM on) first writes where each of its
# threads was, so the log of a run that hung says where.
faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)

from dmls.config.spec import RunSpec  # noqa: E402
from dmls.files import write_json  # noqa: E402
from dmls.training import trainer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, help="resolved run spec (JSON)")
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path, help="resume file")
    args = parser.parse_args()
    rank = os.environ.get("RANK", "0")
    try:
        spec = RunSpec.from_json(args.spec)
        imports = time.perf_counter() - IMPORTS_START
        result = trainer.train(spec, args.data_dir, args.run_dir / "model.pt", args.checkpoint)
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
            },
        )
        raise


if __name__ == "__main__":
    main()
    # Leave without interpreter finalization, as multiprocessing's children do. DDP keeps the
    # gloo process group alive past destroy_process_group(), so its worker threads still run
    # while Python finalizes; one that then drops the last reference to a collective's tensor
    # needs the GIL, is told to exit (pthread_exit) inside a noexcept destructor, and the rank
    # dies by SIGABRT ("terminate called without an active exception") after its result is
    # written. Everything is written by now; an error above still exits with its traceback.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
