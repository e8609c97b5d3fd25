"""Which jobs Snakemake starts first (issue #41: the DAG's long poles). When jobs wait for
cores or GPUs, Snakemake starts the ready job of highest `priority`; a long job started last
keeps the host busy alone at the end. So the longest start first:

- the special studies that hold a GPU for minutes (C, A5's collectives sweep, D4, D5: 93-906 s
  each in the example DAG, docs/example-report/dag_table.txt) get `LONG_STUDY`, above every run;
- a run's priority grows with the samples it trains, every seed and epoch counted, and three
  times that where its step replays no CUDA graph (eager, the course's DataLoader, DataParallel,
  accelerate, fp8, the CPU: their steps are several times slower, docs/performance.md), on a
  log scale so that the order, not the size, is what counts.

Only the order of the numbers matters; they estimate no seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dmls.config.data_sizes import known_train_samples

LONG_STUDY = 40
# A run's training set where only reading the data tells its size (the user's own files).
UNKNOWN_SAMPLES = 10_000


def replays_graph(spec: Any) -> bool:
    """Whether the run's step can replay a CUDA graph (the engine's fast path)."""
    return (
        spec.device == "cuda"
        and spec.step in ("graph", "compile")
        and spec.loader == "device"
        and not spec.replicates_in_one_process  # DataParallel
        and not spec.precision_by_launcher  # accelerate
        and spec.precision != "fp8"
    )


def run_priority(spec: Any, data: Mapping[str, Any], schema: Mapping[str, Any]) -> int:
    """A run's priority: log2 of its samples trained (seeds × epochs × training samples, in
    thousands), × 3 where its step replays no graph; between 0 and LONG_STUDY - 1."""
    samples = spec.train_samples
    if not samples:
        known = known_train_samples(spec.dataset, data, schema)
        samples = known[0] if known else UNKNOWN_SAMPLES
    work = spec.seeds * spec.epochs * samples / 1000 * (1 if replays_graph(spec) else 3)
    return min(LONG_STUDY - 1, max(0, round(math.log2(max(work, 1)))))
