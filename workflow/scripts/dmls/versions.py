"""What earlier versions of a run's record (metrics.json) hold that this one defines otherwise,
and how such a record is read now: the one place that knows them. dmls/record.py reads every
record through `metrics_v3_as_v4`; its schema then checks the result as a record of its
VERSION (TO_VERSION, tested equal).

Version 3 → 4: version 3 added CUDA graphs' reserved pools into what a step adds, so that with
what was held before the step it could exceed the allocated peak (the example's A6 at batch
128: 48.1 + 157.9 MiB against a 185.5 MiB peak); version 4 counts allocated bytes only and
names the pools apart. An eager step had no pool: its version-3 figure was allocated bytes only
and is kept. Version 3 also kept one seed's memory (the lowest peak) in `memory`, a second
definition beside the seeds' mean; version 4 has none.
"""

from __future__ import annotations

from typing import Any

TO_VERSION = 4
V3_STEP_WHY = (
    "written by metrics version 3, whose step figure added CUDA graphs' reserved pools to "
    "allocated bytes; kept only where the step ran eagerly (no pool)"
)
STEP_KEYS = ("gpu_mem_before_step_bytes", "step_gpu_mem_bytes")


def metrics_v3_as_v4(record: Any) -> Any:
    """`record` (a parsed metrics.json) of version 3 read as version 4: each seed's step figures
    kept where its step ran eagerly, dropped where a CUDA graph's pool was in them (the pools
    were not recorded apart), and said so in `earlier_version`. Any other record is returned
    as it is, for the schema to judge."""
    if not isinstance(record, dict) or record.get("metrics_version") != 3:
        return record
    record = dict(record, metrics_version=TO_VERSION)
    dropped = set()
    for seed in record.get("seeds") or []:
        seed["graph_pool_reserved_bytes"] = None
        if (seed.get("step") or {}).get("mode") != "eager":
            for key in STEP_KEYS:
                if seed.get(key) is not None:
                    seed[key] = None
                    dropped.add(key)
    record.pop("memory", None)
    if dropped:
        record["earlier_version"] = {
            "metrics_version": 3, "dropped": sorted(dropped), "why": V3_STEP_WHY
        }  # fmt: skip
    return record
