"""What an epoch's checkpoint costs, by part, for A1's model on this host's first device.

    python3 bench/checkpoint_cost.py [--repeats 10] [--dir DIR] [--out checkpoint.json]

The pipeline checkpoints after every epoch (dmls/training/trainer.py `_save_checkpoint`, then
dmls/training/checkpoint.py `save`): the model's and optimizer's state onto the CPU, then
torch.save into memory, a sha256 of the payload, and dmls.files.atomic_write (a temporary
sibling, written, fsync'd, renamed over the old file). This times each part, `--repeats`
times, on a trained-for-a-few-steps A1 model with its AdamW state, in the folder `--dir` (the
default: the working directory, where a run's checkpoints live), and the write again without
the fsync, to tell the disk's flush from the write.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from epoch_speed import ROOT, a1_spec

sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from dmls.data import datasets
from dmls.files import atomic_write
from dmls.training.parallel import strategy_for
from dmls.training.trainer import Progress, Trainer


def _write(payload: bytes, f) -> None:
    f.write(payload)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dir", type=Path, default=Path.cwd())
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory(prefix="dmls-ckpt-") as tmp:
        data = Path(tmp)
        datasets.prepare("synthetic_cifar", {"n_train": 512, "n_test": 256}, data)
        spec = a1_spec(
            "ddp_2gpu",
            dataset="synthetic_cifar",
            device=device,
            epochs=1,
            loader="device",
            step="eager",
        )
        strategy = strategy_for(spec)
        process = strategy.join()
        trainer = Trainer(spec, strategy, process, data)
        trainer.train_epoch(0)  # the optimizer's state exists, as after any epoch
        trainer.synchronize()
        progress = asdict(Progress())  # as _save_checkpoint stores it
        parts: dict[str, list[float]] = {}
        work = Path(tempfile.mkdtemp(prefix=".dmls-ckpt-", dir=args.dir))
        try:
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                model = trainer.model_state()
                optimizer = strategy.optimizer_state(trainer.optimizer)
                state = {"model": model, "optimizer": optimizer, "progress": progress}
                t1 = time.perf_counter()
                buffer = io.BytesIO()
                torch.save(state, buffer)
                payload = buffer.getvalue()
                t2 = time.perf_counter()
                hashlib.sha256(payload).hexdigest()
                t3 = time.perf_counter()
                atomic_write(work / "checkpoint.pt", functools.partial(_write, payload))
                t4 = time.perf_counter()
                with open(work / "unsynced.pt", "wb") as f:
                    f.write(payload)
                os.replace(work / "unsynced.pt", work / "unsynced2.pt")
                t5 = time.perf_counter()
                for name, s in (
                    ("state_to_cpu", t1 - t0),
                    ("serialise", t2 - t1),
                    ("sha256", t3 - t2),
                    ("write_fsync_rename", t4 - t3),
                    ("write_rename_no_fsync", t5 - t4),
                ):
                    parts.setdefault(name, []).append(1000 * s)
        finally:
            for f in work.iterdir():
                f.unlink()
            work.rmdir()
    summary = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "payload_mib": len(payload) / 2**20,
        "ms": {
            k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
            for k, v in parts.items()
        },
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(summary | {"each_ms": parts}, indent=1))


if __name__ == "__main__":
    main()
