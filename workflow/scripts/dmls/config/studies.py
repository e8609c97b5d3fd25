"""What the config says of a study's runs, without running them: which settings vary between
them, each run's labels, and the run its comparisons are measured against. Snakemake reads them
while it parses the workflow (report labels, figure captions), so this imports no pandas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def flatten(spec: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested spec as dotted keys ({'optimizer': {'lr': 0.1}} -> {'optimizer.lr': 0.1});
    lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in spec.items():
        if isinstance(value, Mapping):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple) else value


def varying_settings(specs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Dotted spec keys whose value differs between these run specs, in the order they first
    appear (a key some specs lack differs)."""
    flats = [flatten(spec) for spec in specs]
    keys = dict.fromkeys(k for flat in flats for k in flat if k not in ("study", "run"))
    return [k for k in keys if len({_hashable(flat.get(k)) for flat in flats}) > 1]


def setting(value: Any) -> str:
    """A run setting as a label or a table cell: a dash where unset, lists joined ('8,16')."""
    if value is None or value != value:  # (NaN)
        return "—"
    return ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def run_labels(specs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Per run: its name and the settings that vary in its study (Snakemake report labels)."""
    keys = varying_settings(list(specs.values()))
    flats = {run: flatten(spec) for run, spec in specs.items()}
    return {run: {"run": run} | {k: setting(flats[run].get(k)) for k in keys} for run in specs}


def baseline_run(settings: Mapping[str, Any], runs: Sequence[str]) -> str:
    """The run a study's speed-ups are measured against: its `baseline`, else its first run."""
    return settings.get("baseline") or runs[0]


def identical_runs(specs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The run ids ("<study>/<run>") whose settings another run repeats to the last key, their
    names aside: the DAG's A/A jobs, whose speeds measure how much two jobs of identical
    settings differ (dmls.report.quantities.job_noise)."""
    groups: dict[str, list[str]] = {}
    for run_id, spec in specs.items():
        flat = {k: v for k, v in flatten(spec).items() if k not in ("study", "run")}
        groups.setdefault(repr(sorted(flat.items(), key=str)), []).append(run_id)
    return [run_id for group in groups.values() if len(group) > 1 for run_id in group]
