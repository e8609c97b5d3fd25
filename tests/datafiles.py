"""Writers of the course's source formats, for tests: the package only reads them
(dmls.data.sources)."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import tarfile
from pathlib import Path

import numpy as np

from dmls.data.sources import CIFAR10_DIR

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip


def write_cifar10_archive(
    path: Path, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray
) -> str:
    """Write a real-format cifar-10-python.tar.gz (train split over 5 batches); return its md5.

    Deterministic (fixed mtimes), so the same arrays give the same md5.
    """
    path = Path(path)

    def batch(x: np.ndarray, y: np.ndarray, label: str) -> bytes:
        x = np.ascontiguousarray(x, dtype=np.uint8).reshape(len(x), -1)
        if x.shape[1] != 3072:
            raise ValueError(f"images must be (N, 3, 32, 32); got {x.shape[1]} values per image")
        d = {
            b"batch_label": label.encode(),
            b"labels": [int(v) for v in y],
            b"data": x,
            b"filenames": [f"img_{i}.png".encode() for i in range(len(x))],
        }
        return pickle.dumps(d, protocol=4)  # 4: plain bytes opcodes, no out-of-band buffers

    members: list[tuple[str, bytes]] = []
    for i, idx in enumerate(np.array_split(np.arange(len(x_train)), 5), start=1):
        members.append(
            (f"data_batch_{i}", batch(x_train[idx], np.asarray(y_train)[idx], f"batch {i} of 5"))
        )
    members.append(("test_batch", batch(x_test, y_test, "testing batch 1 of 1")))
    meta = {
        b"num_cases_per_batch": int(-(-len(x_train) // 5)),
        b"label_names": [c.encode() for c in CIFAR10_CLASSES],
        b"num_vis": 3072,
    }
    members.append(("batches.meta", pickle.dumps(meta, protocol=4)))

    path.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.USTAR_FORMAT) as tar,
    ):
        for name, blob in members:
            info = tarfile.TarInfo(f"{CIFAR10_DIR}/{name}")
            info.size, info.mtime, info.mode = len(blob), 0, 0o644
            tar.addfile(info, io.BytesIO(blob))
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()
