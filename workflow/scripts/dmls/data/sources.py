"""Readers of the course's source formats, each checked as it is read: CIFAR-10's
cifar-10-python.tar.gz (pickled batches), Fashion-MNIST's IDX files and the tabular set's
.npy arrays. A bad file raises `DataError` naming the file and what is wrong.
Images come back uint8 NCHW, tabular features float32 (N, F), labels int64.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import posixpath
import tarfile
import zlib
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
FASHION_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
TABULAR_FILES = ("train_x.npy", "train_y.npy", "test_x.npy", "test_y.npy")
TABULAR_FEATURES = 512
TABULAR_CLASSES = 20

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class DataError(Exception):
    """Bad or corrupt input: message names the file and what is wrong."""


def file_digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo, usedforsecurity=False) if algo == "md5" else hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _labels(y: Any, n: int, num_classes: int, where: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != n:
        raise DataError(f"{where}: labels have shape {y.shape}, expected ({n},)")
    if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= num_classes):
        raise DataError(
            f"{where}: labels must be integers in [0, {num_classes}); "
            f"found dtype {y.dtype}, range [{y.min()}, {y.max()}]"
        )
    return y.astype(np.int64)


# --------------------------------------------------------------------------- CIFAR-10


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """CIFAR batches are pickles; only allow the numpy classes they need, not arbitrary code."""

    _ALLOWED: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"),
            ("numpy._core.numeric", "_frombuffer"),
            ("numpy.core.numeric", "_frombuffer"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("copy_reg", "_reconstructor"),
            ("copyreg", "_reconstructor"),
            ("__builtin__", "object"),
            ("builtins", "object"),
            # Python 3 protocol-2 pickles store bytes as _codecs.encode(str, "latin1").
            ("_codecs", "encode"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _unpickle(raw: bytes) -> Any:
    # encoding="bytes": the official batches were pickled by Python 2 (keys are b"data" etc.)
    return _NumpyOnlyUnpickler(io.BytesIO(raw), encoding="bytes").load()


def read_cifar10_archive(archive: Path, md5: str | None) -> Arrays:
    """Read cifar-10-python.tar.gz in memory (no extraction); check md5 unless None."""
    archive = Path(archive)
    if not archive.is_file():
        raise DataError(f"CIFAR-10 archive {archive} does not exist")
    if md5:
        actual = file_digest(archive, "md5")
        if actual != md5.lower():
            raise DataError(
                f"CIFAR-10 archive {archive} is corrupt or not the expected file: "
                f"md5 {actual}, expected {md5}"
            )
    wanted = {*CIFAR10_TRAIN_BATCHES, "test_batch"}
    batches: dict[str, Any] = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                norm = posixpath.normpath(member.name).lstrip("/")
                top, _, base = norm.partition("/")
                if top != CIFAR10_DIR or base not in wanted or not member.isfile():
                    continue
                f = tar.extractfile(member)
                assert f is not None  # isfile() members always have data
                try:
                    batches[base] = _unpickle(f.read())
                except Exception as e:
                    raise DataError(
                        f"{archive}: member {member.name} is not a valid pickle: {e}"
                    ) from e
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DataError(f"{archive} is not a readable tar.gz archive: {e}") from e
    missing = sorted(wanted - batches.keys())
    if missing:
        raise DataError(
            f"{archive} lacks member(s) {', '.join(f'{CIFAR10_DIR}/{m}' for m in missing)}"
        )

    def split(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for nm in names:
            b, where = batches[nm], f"{archive} member {CIFAR10_DIR}/{nm}"
            if not isinstance(b, dict) or b"data" not in b or b"labels" not in b:
                raise DataError(f"{where}: expected a dict with b'data' and b'labels'")
            x = np.asarray(b[b"data"])
            if x.ndim != 2 or x.shape[1] != 3072 or x.dtype != np.uint8:
                raise DataError(
                    f"{where}: b'data' has shape {x.shape} dtype {x.dtype}, "
                    "expected (N, 3072) uint8"
                )
            xs.append(x.reshape(-1, 3, 32, 32))
            ys.append(_labels(b[b"labels"], x.shape[0], 10, where))
        return np.concatenate(xs), np.concatenate(ys)

    x_train, y_train = split(CIFAR10_TRAIN_BATCHES)
    x_test, y_test = split(("test_batch",))
    return x_train, y_train, x_test, y_test


# --------------------------------------------------------------------------- IDX


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (gzip or plain) of unsigned bytes: images (N,28,28) or labels (N,)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"IDX file {path} can't be read: {e}") from e
    if len(raw) < 4 or raw[0:2] != b"\x00\x00":
        raise DataError(f"IDX file {path}: bad magic number {raw[:4].hex()}")
    dtype_code, ndim = raw[2], raw[3]
    if dtype_code != 0x08:
        raise DataError(f"IDX file {path}: data type 0x{dtype_code:02x}, expected 0x08 (ubyte)")
    if ndim not in (1, 3):
        raise DataError(f"IDX file {path}: {ndim} dimensions, expected 1 (labels) or 3 (images)")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"IDX file {path}: truncated header")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims))
    if len(raw) - header != expected:
        raise DataError(
            f"IDX file {path}: dims {dims} need {expected} data bytes, found {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


def _find_idx(directory: Path, stem: str) -> Path | None:
    for p in (directory / stem, directory / f"{stem}.gz"):
        if p.is_file():
            return p
    return None


def read_fashion_mnist_dir(directory: Path) -> Arrays:
    """Read the four Fashion-MNIST IDX files (plain or .gz) from a folder; images (N,1,28,28)."""
    directory = Path(directory)
    paths = {stem: _find_idx(directory, stem) for stem in FASHION_MNIST_FILES}
    missing = [s for s, p in paths.items() if p is None]
    if missing:
        raise DataError(f"{directory} lacks Fashion-MNIST file(s): {', '.join(missing)} (or .gz)")
    out: list[np.ndarray] = []
    for split in ("train", "t10k"):
        img_path = paths[f"{split}-images-idx3-ubyte"]
        lbl_path = paths[f"{split}-labels-idx1-ubyte"]
        assert img_path is not None and lbl_path is not None
        x, y = read_idx(img_path), read_idx(lbl_path)
        if x.ndim != 3 or x.shape[1:] != (28, 28):
            raise DataError(f"{img_path}: images have shape {x.shape}, expected (N, 28, 28)")
        out += [x[:, None], _labels(y, x.shape[0], 10, str(lbl_path))]
    return out[0], out[1], out[2], out[3]


# --------------------------------------------------------------------------- tabular


def read_tabular_dir(
    directory: Path, features: int = TABULAR_FEATURES, num_classes: int = TABULAR_CLASSES
) -> Arrays:
    """Read train_x/train_y/test_x/test_y .npy; x -> float32 (N, features), y -> int64."""
    directory = Path(directory)
    arrays: dict[str, np.ndarray] = {}
    for fname in TABULAR_FILES:
        p = directory / fname
        if not p.is_file():
            raise DataError(f"tabular file {p} does not exist (data.tabular.dir = {directory})")
        try:
            arrays[fname] = np.load(p, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise DataError(f"tabular file {p} is not a readable .npy array: {e}") from e
    out: list[np.ndarray] = []
    for split in ("train", "test"):
        xp, yp = directory / f"{split}_x.npy", directory / f"{split}_y.npy"
        x, y = arrays[xp.name], arrays[yp.name]
        if x.ndim != 2 or x.shape[1] != features or x.shape[0] == 0:
            raise DataError(f"{xp}: shape {x.shape}, expected (N, {features}) with N > 0")
        if not np.issubdtype(x.dtype, np.floating):
            raise DataError(f"{xp}: dtype {x.dtype}, expected a floating dtype (e.g. float32)")
        x = x.astype(np.float32)
        if not np.isfinite(x).all():
            raise DataError(f"{xp}: contains NaN or infinite values")
        if y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise DataError(f"{yp}: shape {y.shape}, expected ({x.shape[0]},) to match {xp.name}")
        if not np.issubdtype(y.dtype, np.integer):
            raise DataError(f"{yp}: dtype {y.dtype}, expected an integer dtype (class ids)")
        if y.min() < 0 or y.max() >= num_classes:
            raise DataError(
                f"{yp}: labels range [{y.min()}, {y.max()}], expected [0, {num_classes})"
            )
        out += [x, y.astype(np.int64)]
    return out[0], out[1], out[2], out[3]
