"""Worker entry point: one training process, started by a launcher (see dmls/launch.py).

python train.py --spec '<json>' --data-dir results/data --run-dir results/runs/<study>/<run>
"""

import argparse
import os
import traceback
from pathlib import Path

from dmls import engine
from dmls.io import write_json
from dmls.spec import RunSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True, help="resolved run spec (JSON)")
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--run-dir", required=True, type=Path)
    args = parser.parse_args()
    rank = os.environ.get("RANK", "0")
    try:
        spec = RunSpec.from_json(args.spec)
        result = engine.train(spec, args.data_dir, args.run_dir / "model.pt")
        if result is not None:
            write_json(args.run_dir / "worker.json", result)
    except BaseException as exc:
        # The supervisor reports the first rank's error as the run's reason; the full
        # traceback goes to the log.
        write_json(
            args.run_dir / f"error-rank{rank}.json",
            {
                "rank": int(rank),
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            },
        )
        raise


if __name__ == "__main__":
    main()
