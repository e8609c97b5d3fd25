"""A rank for the tests of special/ranks.py, started as a special study's ranks are:
`python -m rank_program '<json>'`. Rank `fails` (if any) raises after `after_s`; every other
rank sleeps, in no collective, so that only being stopped ends it. Each writes its pid into
`pids`."""

import json
import os
import sys
import time
from pathlib import Path

from dmls.protocol import as_rank


def main(fails: int | None, after_s: float, reports: str, pids: str) -> None:
    with as_rank(Path(reports)) as rank:
        Path(pids, f"rank{rank}").write_text(str(os.getpid()))
        if rank == fails:
            time.sleep(after_s)
            raise RuntimeError(f"rank {rank} gave up")
        time.sleep(3600)


if __name__ == "__main__":
    main(**json.loads(sys.argv[1]))
