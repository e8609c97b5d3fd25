"""One run's numbers, built once from its record: the numbers layer under the report's words.

Which seeds a quantity counts is record.counted_seeds (the one rule: the seeds that finished,
and for GPU memory and the time to a target those of a warm process); `RunNumbers` gives a
run's values over them, their mean and interval (dmls/stats.py), how the text names those
seeds, and by how much a process's first seed, left out, measured more. The sentences
(answers, observations, captions) read these and compute no statistic of their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dmls import record, stats


@dataclass(frozen=True)
class RunNumbers:
    """A run's record read as numbers (`record`: its metrics.json)."""

    record: dict[str, Any]

    def counted(self, metric: str) -> list[int]:
        """The indices of the seeds `metric` counts (record.counted_seeds)."""
        return record.counted_seeds(self.record, metric)

    def values(self, metric: str, rule: str | None = None) -> list[float]:
        """The finite values of `metric` over the seeds it counts (those `rule`'s metric counts,
        where given)."""
        return record.counted_values(self.record, metric, rule)

    def by_seed(self, metric: str, rule: str | None = None) -> dict[int, float]:
        """`values`, keyed by the seed each was measured in (stats.paired pairs them)."""
        seeds = (self.record["seeds"][k] for k in self.counted(rule or metric))
        found = ((seed["seed"], record.seed_value(seed, metric)) for seed in seeds)
        return {k: float(v) for k, v in found if v is not None and math.isfinite(float(v))}

    def estimate(self, metric: str) -> stats.Estimate | None:
        """The mean of `values` and its 95% interval (None without a value)."""
        return stats.mean_interval(self.values(metric))

    def finals(self, metric: str = "test_accuracy") -> list[dict[str, Any]]:
        """The final numbers of the seeds `metric` counts."""
        return [self.record["seeds"][k]["final"] for k in self.counted(metric)]

    def seeds_said(self, metric: str) -> str:
        """Which seeds `metric` counts, as the text names them: "seeds 0–2", "warm seeds 1 and
        2"; "one value per job" for what the seeds don't record (host RSS)."""
        if metric not in record.SEED_METRICS:
            return "one value per job"
        counted = self.counted(metric)
        names = [self.record["seeds"][k]["seed"] for k in counted]
        warm = metric in record.WARM_METRICS and set(counted) <= set(record.warm_seeds(self.record))
        return f"{'warm ' if warm else ''}seed{'s' if len(names) > 1 else ''} {span(names)}"

    def first_seed_excess(self, metric: str) -> float:
        """How much more a process's first seed measured than the warm seeds `metric` counts
        (record.first_seed_excess, the one definition; 0 where no seed was left out)."""
        return record.first_seed_excess(self.record["seeds"], metric) or 0.0

    @property
    def eager(self) -> bool:
        """Whether its steps ran eagerly (not replayed from a CUDA graph)."""
        return (self.record.get("step") or {}).get("mode") == "eager"


def span(numbers: list[int]) -> str:
    """Seed numbers as the text names them: "0–2" when consecutive, else "1 and 2", "0, 2
    and 5"."""
    numbers = sorted(numbers)
    if len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]}–{numbers[-1]}"
    head = ", ".join(map(str, numbers[:-1]))
    return f"{head} and {numbers[-1]}" if head else str(numbers[-1])
