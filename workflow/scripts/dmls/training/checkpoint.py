"""Resume: the state of a run at the end of its last finished epoch, in one file.

The file lives outside the rule's outputs (`{results_dir}/checkpoints/<study>/<run>.pt`), so
Snakemake never deletes it along with an incomplete `metrics.json`, and it survives
`--rerun-incomplete`, a Slurm requeue and a `kill -9`. Rank 0 writes it atomically after every
epoch; every rank reads it back. It holds all the next epoch depends on: weights, optimizer,
GradScaler and scheduler states, each rank's RNG states (Python, NumPy, torch CPU and CUDA),
the epoch count (the DistributedSampler's shuffle is a function of seed and epoch), the
history and the early-stopping state. It is tied to the spec by the SHA-256 of the spec's
JSON, so a changed spec starts afresh; the supervisor deletes it once the run has ended.

It is read with `torch.load(..., weights_only=True)`, which unpickles tensors and plain
containers only, so everything in it is tensors, numbers, strings, lists and dicts.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dmls.config.spec import RunSpec
from dmls.files import atomic_write

FORMAT_VERSION = 1


def spec_hash(spec: RunSpec) -> str:
    return hashlib.sha256(spec.to_json().encode()).hexdigest()


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's random number generators."""
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [keys.tolist(), pos, has_gauss, cached_gaussian],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    random.setstate(state["python"])
    keys, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state(("MT19937", np.array(keys, np.uint32), pos, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def save(path: Path, spec: RunSpec, state: dict[str, Any]) -> None:
    record = {"format": FORMAT_VERSION, "spec_sha256": spec_hash(spec), **state}
    atomic_write(path, lambda f: torch.save(record, f))


def load(path: Path, spec: RunSpec) -> tuple[dict[str, Any] | None, str]:
    """The checkpoint for `spec` at `path` (None if there is none to resume) and why."""
    if not path.exists():
        return None, f"no checkpoint at {path}: starting from epoch 1"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise RuntimeError(
            f"checkpoint {path} can't be read ({type(e).__name__}: {e}); delete it to start "
            "the run from epoch 1"
        ) from e
    if state.get("format") != FORMAT_VERSION or state.get("spec_sha256") != spec_hash(spec):
        return None, (
            f"ignoring checkpoint {path}: it was written for another spec or format "
            f"(spec sha256 {state.get('spec_sha256')}, this run's {spec_hash(spec)}); "
            "starting from epoch 1"
        )
    return state, f"resuming from checkpoint {path}: {state['epoch']} epoch(s) finished"
