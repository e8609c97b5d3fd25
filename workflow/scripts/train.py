"""Worker entry point: one training process, started by a launcher (see dmls/launch.py).

python train.py --spec '<json>' --data-dir results/data --run-dir results/runs/<study>/<run>
                --checkpoint results/checkpoints/<study>/<run>.pt
"""

import argparse
import os
import signal
import time
import traceback
from pathlib import Path

from dmls.launch import die_with_parent

# First, before importing torch takes seconds: a rank must not outlive its launcher (a
# `kill -9` of torchrun would leave it training, and writing checkpoints, on its own).
die_with_parent(signal.SIGKILL)

from dmls import engine  # noqa: E402
from dmls.io import write_json  # noqa: E402
from dmls.spec import RunSpec  # noqa: E402


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
        result = engine.train(spec, args.data_dir, args.run_dir / "model.pt", args.checkpoint)
        if result is not None:
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
