"""Resume: the state of a run at the end of its last finished epoch, in one file.

The file lives outside the rule's outputs (`{results_dir}/checkpoints/<study>/<run>.pt`), so
Snakemake never deletes it along with an incomplete `metrics.json`, and it survives
`--rerun-incomplete`, a Slurm requeue and a `kill -9`. Rank 0 writes it atomically after every
epoch; every rank reads it back. It holds all the next epoch depends on: weights, optimizer,
GradScaler and scheduler states, each rank's RNG states (Python, NumPy, torch CPU and CUDA),
the epoch count (the DistributedSampler's shuffle is a function of seed and epoch), the
history and the early-stopping state; under early stopping also the weights of the epoch with
the lowest validation loss, which the run goes back to when it stops (`best_model`: a resumed
run ends where an uninterrupted one does, a checkpoint without them starts the run afresh).
The supervisor deletes it once the run has ended.

A checkpoint resumes only the run whose numbers it would continue (`identity`): the same spec
(the SHA-256 of its JSON), the same prepared data (the SHA-256 of the .npz, from its manifest:
a dataset prepared again from other files is other numbers, even under the same spec) and the
same torch version (other kernels, other floats: a history half from one version and half from
another measures neither). The code itself is not part of it: a checkout changes far more often
than what a run computes, and a run that must start afresh after a code change is `--forcerun`.
Anything else starts the run afresh, and says why.

The file is one JSON header line (format, identity, the payload's SHA-256 and size), then the
payload: the state as `torch.save` writes it, read back with `torch.load(...,
weights_only=True)`, which unpickles tensors and plain containers only. A payload whose digest
is not the header's (a damaged disk, a truncated copy, bytes overwritten) is never resumed: the
file is set aside beside the run's checkpoint path, named in the log, and the run starts afresh.
A full disk while writing it is `DiskFull`: the run stops, and a rerun resumes from the
checkpoint before, which the atomic write left as it was.

The epochs' checkpoints are written by a `Writer`, on a thread of its own: the state is copied
to the CPU when the epoch ends, and serialising, hashing and writing it (about 25 ms a
checkpoint of A1's model on a lent H100 host: bench/checkpoint_cost.py) run while the next
epoch trains. At most one write is in flight; the next checkpoint, the end of training (or its
failure) and a fault drill's epoch wait for it first, so a checkpoint is on disk before the
seed's end replaces it, a run that fails resumes from its last finished epoch as before, and a
drill resumes where it always did. Only a kill from outside within those milliseconds finds
the checkpoint before, and resumes one epoch earlier.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import io
import json
import random
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from dmls.config.spec import RunSpec
from dmls.files import atomic_write

FORMAT_VERSION = 2


class DiskFull(OSError):
    """No space left on the device while writing a checkpoint: no result of the run, which a
    rerun resumes once there is space (the worker marks its error `resumable`)."""

    resumable = True


def spec_hash(spec: RunSpec) -> str:
    return hashlib.sha256(spec.to_json().encode()).hexdigest()


def identity(spec: RunSpec, manifest: dict[str, Any]) -> dict[str, str]:
    """What a checkpoint's numbers depend on besides its own content (the module docstring
    says why each)."""
    return {
        "spec_sha256": spec_hash(spec),
        "data_sha256": manifest["sha256"],
        "torch": torch.__version__,
    }


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's random number generators."""
    # The legacy tuple (get_state's default); the stub allows the dict form too.
    state = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    _, keys, pos, has_gauss, cached_gaussian = state
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


def save(path: Path, key: dict[str, str], state: dict[str, Any]) -> None:
    """Write `state` for the run of identity `key`, atomically."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    header = {
        "format": FORMAT_VERSION,
        "identity": key,
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "payload_bytes": len(payload),
    }
    try:
        atomic_write(path, lambda f: f.write(json.dumps(header).encode() + b"\n" + payload))
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        free = shutil.disk_usage(path.parent).free
        saved = state.get("epoch", 1) - 1  # what the checkpoint left as it was holds
        resume = f"after epoch {saved}, its last saved one" if saved else "from epoch 1"
        raise DiskFull(
            errno.ENOSPC,
            f"no space left on the device writing checkpoint {path} ({len(payload) / 2**20:.1f} "
            f"MiB; {free / 2**20:.1f} MiB free there): free space, then rerun; the run resumes "
            f"{resume}",
        ) from e


class Writer:
    """Writes one run's epoch checkpoints (`save`) on a thread of its own, one at a time, in
    order. `submit` copies every tensor of the state to the CPU before it returns, so training
    may change the weights and the optimizer's state meanwhile; a write's error (DiskFull) is
    raised by the next `submit` or `flush`."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dmls-checkpoint")
        self._pending: Future | None = None

    def submit(self, path: Path, key: dict[str, str], state: dict[str, Any]) -> None:
        self.flush()
        staged = torch.utils._pytree.tree_map_only(
            torch.Tensor, lambda t: t.detach().to("cpu", copy=True), state
        )
        self._pending = self._pool.submit(save, path, key, staged)

    def flush(self) -> None:
        """Wait for the write in flight, if any; raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._pool.shutdown()


def load(
    path: Path, key: dict[str, str], *, set_aside: bool = True
) -> tuple[dict[str, Any] | None, str]:
    """The checkpoint of the run of identity `key` at `path` (None if there is none to resume)
    and why. A damaged file is moved aside (when `set_aside`: one rank does it) and the run
    starts afresh."""
    if not path.exists():
        return None, f"no checkpoint at {path}: starting from epoch 1"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:  # another rank set it aside meanwhile
        return None, f"no checkpoint at {path}: starting from epoch 1"
    header, problem = _read_header(raw)
    if problem is None and header["identity"] != key:
        changed = sorted(k for k in key if header["identity"].get(k) != key[k])
        return None, (
            f"ignoring checkpoint {path}: it was written for another "
            + ", ".join(f"{k} ({header['identity'].get(k)}; this run's {key[k]})" for k in changed)
            + "; starting from epoch 1"
        )
    if problem is None:
        payload = raw[raw.index(b"\n") + 1 :]
        if len(payload) != header["payload_bytes"]:
            problem = f"{len(payload)} payload bytes, the header says {header['payload_bytes']}"
        elif hashlib.sha256(payload).hexdigest() != header["payload_sha256"]:
            problem = "its content's SHA-256 is not the one written with it"
    if problem is None:
        try:
            state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
        except Exception as e:
            problem = f"{type(e).__name__}: {e}"
    if problem is not None:
        where = _set_aside(path) if set_aside else path
        return None, (
            f"checkpoint {path} is damaged ({problem}); it is not resumed: moved to {where}, "
            "starting from epoch 1"
        )
    return state, f"resuming from checkpoint {path}: {state['epoch']} epoch(s) finished"


def _read_header(raw: bytes) -> tuple[dict[str, Any], str | None]:
    line, newline, _ = raw.partition(b"\n")
    try:
        header = json.loads(line) if newline else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT_VERSION:
        return {}, f"no header of checkpoint format {FORMAT_VERSION}"
    if not {"identity", "payload_sha256", "payload_bytes"} <= set(header):
        return {}, "its header lacks the identity or the payload's digest"
    return header, None


def _set_aside(path: Path) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    with contextlib.suppress(FileNotFoundError):  # another process moved it first
        path.rename(target)
    return target


def read_identity(path: Path) -> dict[str, str]:
    """The identity a checkpoint file was written for (a tool's look at it; runs use `load`)."""
    header, problem = _read_header(path.read_bytes())
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    return header["identity"]
