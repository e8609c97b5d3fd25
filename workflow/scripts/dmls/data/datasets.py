"""Dataset preparation: read each dataset once into a canonical cached form.

`prepare` writes `<out_dir>/<name>.npz` (x_train, y_train, x_test, y_test) and
`<out_dir>/<name>.json` (the manifest); `load` reads them back for training.
Images are uint8 NCHW, tabular features float32 (N, F), labels int64.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import pickle
import posixpath
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dmls.files import atomic_write, write_json

log = logging.getLogger(__name__)

DATASETS: tuple[str, ...] = ("cifar10", "fashion_mnist", "tabular", "synthetic_cifar")

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_FILENAME = "cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
FASHION_MNIST_DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
TABULAR_FILES = ("train_x.npy", "train_y.npy", "test_x.npy", "test_y.npy")
TABULAR_FEATURES = 512
TABULAR_CLASSES = 20

# Shape facts per dataset, also written into "unavailable" manifests so the engine
# can report what it would have trained on.
_SPECS: dict[str, tuple[list[int], int]] = {
    "cifar10": ([3, 32, 32], 10),
    "fashion_mnist": ([1, 28, 28], 10),
    "tabular": ([TABULAR_FEATURES], TABULAR_CLASSES),
    "synthetic_cifar": ([3, 32, 32], 10),
}

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class DataError(Exception):
    """Bad or corrupt input: message names the file and what is wrong."""


class DataUnavailable(Exception):
    """Data can't be obtained here; message says exactly how to provide it."""


@dataclass(frozen=True, eq=False)  # eq=False: element-wise array equality makes __eq__ ambiguous
class Dataset:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    manifest: dict


# --------------------------------------------------------------------------- helpers


def _file_digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo, usedforsecurity=False) if algo == "md5" else hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def channel_mean_std(x: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean/std of uint8 NCHW images scaled to [0,1].

    Exact integer sums in chunks: a float64 copy of CIFAR's train set would need 1.2 GB.
    """
    n, c = x.shape[0], x.shape[1]
    s = np.zeros(c, dtype=np.uint64)
    ss = np.zeros(c, dtype=np.uint64)
    for start in range(0, n, 2048):
        chunk = x[start : start + 2048].astype(np.uint64)
        s += chunk.sum(axis=(0, 2, 3), dtype=np.uint64)
        ss += (chunk * chunk).sum(axis=(0, 2, 3), dtype=np.uint64)
    count = float(n * x.shape[2] * x.shape[3])
    mean = s.astype(np.float64) / (count * 255.0)
    var = ss.astype(np.float64) / (count * 255.0**2) - mean**2
    std = np.sqrt(np.maximum(var, 0.0))
    return [float(v) for v in mean], [float(v) for v in std]


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
        actual = _file_digest(archive, "md5")
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
    return _file_digest(path, "md5")


def _download_url(url: str, root: str, filename: str, md5: str | None) -> None:
    """Seam for tests (monkeypatch this); torchvision checks the md5 after downloading."""
    from torchvision.datasets.utils import download_url

    download_url(url=url, root=root, filename=filename, md5=md5)


def _prepare_cifar10(cfg: dict) -> tuple[Arrays, str]:
    md5 = cfg.get("md5", CIFAR10_MD5)
    if cfg.get("archive"):
        archive = Path(cfg["archive"])
        if not archive.is_file():
            raise DataError(
                f"data.cifar10.archive is set to {archive}, which does not exist "
                "(point it at a cifar-10-python.tar.gz, or set it to null to download)"
            )
        arrays = read_cifar10_archive(archive, md5)
        return arrays, f"CIFAR-10 archive {archive} ({'md5 ok' if md5 else 'md5 not checked'})"

    how = (
        f"Download {CIFAR10_URL} (md5 {md5}) on a machine with internet access and "
        "set data.cifar10.archive: /path/to/cifar-10-python.tar.gz in your config "
        "(or --config / --configfile on the command line)."
    )
    if not cfg.get("download", True):
        raise DataUnavailable(
            f"CIFAR-10: no archive given and data.cifar10.download is false. {how}"
        )
    cache_dir = Path(cfg.get("cache_dir") or "resources/cifar10")
    try:
        _download_url(url=CIFAR10_URL, root=str(cache_dir), filename=CIFAR10_FILENAME, md5=md5)
    except Exception as e:  # network down, proxy, md5 mismatch of a truncated download, ...
        raise DataUnavailable(
            f"CIFAR-10 download from {CIFAR10_URL} failed ({type(e).__name__}: {e}). {how}"
        ) from e
    archive = cache_dir / CIFAR10_FILENAME
    return read_cifar10_archive(archive, md5), f"CIFAR-10 download {CIFAR10_URL} -> {archive}"


# --------------------------------------------------------------------------- Fashion-MNIST


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


def _download_fashion_mnist(cache_dir: Path) -> Path:
    """Seam for tests (monkeypatch this). Returns torchvision's raw folder."""
    from torchvision.datasets import FashionMNIST

    FashionMNIST(str(cache_dir), train=True, download=True)  # fetches all four files
    return cache_dir / "FashionMNIST" / "raw"


def _prepare_fashion_mnist(cfg: dict) -> tuple[Arrays, str]:
    debian_dir = Path(cfg.get("debian_dir") or FASHION_MNIST_DEBIAN_DIR)
    gz = [debian_dir / f"{stem}.gz" for stem in FASHION_MNIST_FILES]
    present = [p.is_file() for p in gz]
    if all(present):
        # Read Debian's files directly: Debian re-gzips them, so the .gz md5s differ from
        # the upstream ones torchvision checks and torchvision would reject/re-download them.
        label = (
            "Debian dataset-fashion-mnist"
            if str(debian_dir) == FASHION_MNIST_DEBIAN_DIR
            else "Fashion-MNIST IDX files"
        )
        return read_fashion_mnist_dir(debian_dir), f"{label} {debian_dir}"
    if any(present):
        missing = [p.name for p, ok in zip(gz, present, strict=True) if not ok]
        raise DataError(f"data.fashion_mnist.debian_dir {debian_dir} lacks {', '.join(missing)}")

    how = (
        "apt-get install dataset-fashion-mnist, or set data.fashion_mnist.debian_dir to a "
        f"folder holding the four IDX files ({', '.join(f'{s}.gz' for s in FASHION_MNIST_FILES)})."
    )
    if not cfg.get("download", True):
        raise DataUnavailable(
            f"Fashion-MNIST: {debian_dir} lacks the IDX files and "
            f"data.fashion_mnist.download is false. {how}"
        )
    cache_dir = Path(cfg.get("cache_dir") or "resources/fashion_mnist")
    try:
        raw = _download_fashion_mnist(cache_dir)
    except Exception as e:  # network down, mirror gone, md5 mismatch, ...
        raise DataUnavailable(
            f"Fashion-MNIST: {debian_dir} lacks the IDX files and the torchvision download "
            f"failed ({type(e).__name__}: {e}). {how}"
        ) from e
    return read_fashion_mnist_dir(raw), f"Fashion-MNIST download via torchvision -> {raw}"


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


def _balanced_labels(rng: np.random.Generator, n: int, num_classes: int) -> np.ndarray:
    # Round-robin then shuffle: every class present whenever n >= num_classes.
    return rng.permutation(np.arange(n) % num_classes).astype(np.int64)


def make_synthetic_tabular(
    n_train: int,
    n_test: int,
    features: int = TABULAR_FEATURES,
    num_classes: int = TABULAR_CLASSES,
    seed: int = 0,
) -> Arrays:
    """Gaussian classes around centroids in a random 16-d subspace, plus isotropic noise.

    Tuned so Linear(512,32)-BN-ReLU-Linear(32,20) reaches ~75-85% test accuracy in 5 epochs
    (chance 5%): learnable, not trivial.
    """
    rng = np.random.default_rng(seed)
    sub = min(16, features)
    basis, _ = np.linalg.qr(rng.standard_normal((features, sub)))  # orthonormal columns
    centroids = rng.standard_normal((num_classes, sub))

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = _balanced_labels(rng, n, num_classes)
        # Within-class spread 1.1 vs unit-variance centroids makes neighbouring classes overlap.
        z = centroids[y] + 1.1 * rng.standard_normal((n, sub))
        x = z @ basis.T * np.sqrt(features / sub) + rng.standard_normal((n, features))
        return x.astype(np.float32), y

    x_train, y_train = draw(n_train)
    x_test, y_test = draw(n_test)
    return x_train, y_train, x_test, y_test


def _upsample(field: np.ndarray, size: int) -> np.ndarray:
    """Bilinear upsampling of (..., k, k) to (..., size, size) via separable interpolation."""
    k = field.shape[-1]
    pos = np.linspace(0, k - 1, size)
    lo = np.floor(pos).astype(int).clip(0, k - 2)
    w = pos - lo
    m = np.zeros((size, k))
    m[np.arange(size), lo] = 1 - w
    m[np.arange(size), lo + 1] += w
    return np.einsum("hk,...kl,wl->...hw", m, field, m)


def make_synthetic_images(
    n_train: int,
    n_test: int,
    shape: tuple[int, int, int] = (3, 32, 32),
    num_classes: int = 10,
    seed: int = 0,
) -> Arrays:
    """uint8 NCHW images: per-class smooth random template + per-image smooth and pixel noise."""
    c, h, w = shape
    if h != w:
        raise ValueError(f"square images only, got {shape}")
    rng = np.random.default_rng(seed)
    # Template amplitude 12 (vs noise 30 smooth + 25 pixel) gives a ridge classifier on raw
    # pixels ~70% with 512 training images (chance 10%).
    templates = 12.0 * _upsample(rng.standard_normal((num_classes, c, 4, 4)), h)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = _balanced_labels(rng, n, num_classes)
        smooth = 30.0 * _upsample(rng.standard_normal((n, c, 4, 4)), h)
        x = 128.0 + templates[y] + smooth + 25.0 * rng.standard_normal((n, c, h, w))
        return np.clip(np.rint(x), 0, 255).astype(np.uint8), y

    x_train, y_train = draw(n_train)
    x_test, y_test = draw(n_test)
    return x_train, y_train, x_test, y_test


# --------------------------------------------------------------------------- prepare / load


def _synthetic_cfg(cfg: dict, n_train: int, n_test: int) -> tuple[int, int, int]:
    return int(cfg.get("n_train", n_train)), int(cfg.get("n_test", n_test)), int(cfg.get("seed", 0))


def _obtain(name: str, cfg: dict) -> tuple[Arrays, str, bool]:
    """Return (arrays, source, synthetic) for one dataset."""
    if name == "cifar10":
        arrays, source = _prepare_cifar10(cfg)
        return arrays, source, False
    if name == "fashion_mnist":
        arrays, source = _prepare_fashion_mnist(cfg)
        return arrays, source, False
    if name == "tabular":
        if cfg.get("dir"):
            d = Path(cfg["dir"])
            if not d.is_dir():
                raise DataError(f"data.tabular.dir is set to {d}, which is not a folder")
            return read_tabular_dir(d), f"tabular .npy files {d}", False
        n_train, n_test, seed = _synthetic_cfg(cfg.get("synthetic") or {}, 8000, 2000)
        arrays = make_synthetic_tabular(n_train, n_test, seed=seed)
        return arrays, f"synthetic, seed {seed} (20 Gaussian classes in a 16-d subspace)", True
    if name == "synthetic_cifar":
        n_train, n_test, seed = _synthetic_cfg(cfg, 512, 256)
        arrays = make_synthetic_images(n_train, n_test, (3, 32, 32), 10, seed)
        return arrays, f"synthetic, seed {seed}", True
    raise DataError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")


def source_files(name: str, cfg: dict) -> list[Path]:
    """The user's own files dataset `name` is read from under `cfg` (those that exist; a
    missing one is `prepare`'s error to report): the `prepare_data` rule's inputs, so that
    replacing one prepares the data again and reruns what depends on it. Downloads and the
    system's Debian files are not the user's to replace, and synthetic sets have none."""
    cfg = cfg or {}
    if name == "tabular" and cfg.get("dir"):
        candidates = [Path(cfg["dir"]) / f for f in TABULAR_FILES]
    elif name == "cifar10" and cfg.get("archive"):
        candidates = [Path(cfg["archive"])]
    elif name == "fashion_mnist" and cfg.get("debian_dir"):
        candidates = [Path(cfg["debian_dir"]) / f"{stem}.gz" for stem in FASHION_MNIST_FILES]
    else:
        candidates = []
    return [p for p in candidates if p.is_file()]


def prepare(name: str, cfg: dict, out_dir: Path, strict: bool = False) -> dict:
    """Write <out_dir>/<name>.json (always) and <name>.npz (status ok); return the manifest.

    DataError always propagates; DataUnavailable propagates only when strict.
    """
    out_dir = Path(out_dir)
    cfg = dict(cfg or {})
    npz_path, manifest_path = out_dir / f"{name}.npz", out_dir / f"{name}.json"
    input_shape, num_classes = _SPECS.get(name, ([], 0))
    try:
        (x_train, y_train, x_test, y_test), source, synthetic = _obtain(name, cfg)
    except DataUnavailable as e:
        if strict:
            raise
        log.warning("%s unavailable: %s", name, e)
        npz_path.unlink(missing_ok=True)  # a stale npz must not outlive an unavailable manifest
        manifest = {
            "name": name,
            "status": "unavailable",
            "reason": str(e),
            "synthetic": False,
            "source": None,
            "input_shape": input_shape,
            "num_classes": num_classes,
            "n_train": 0,
            "n_test": 0,
            "mean": None,
            "std": None,
            "sha256": None,
        }
        write_json(manifest_path, manifest)
        return manifest

    is_image = x_train.ndim == 4
    mean, std = channel_mean_std(x_train) if is_image else (None, None)
    arrays = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
    # Uncompressed: training loads it every run, and image data barely compresses anyway.
    atomic_write(npz_path, lambda f: np.savez(f, **arrays))
    manifest = {
        "name": name,
        "status": "ok",
        "reason": None,
        "synthetic": synthetic,
        "source": source,
        "input_shape": [int(d) for d in x_train.shape[1:]],
        "num_classes": num_classes,
        "n_train": len(x_train),
        "n_test": len(x_test),
        "mean": mean,
        "std": std,
        "sha256": _file_digest(npz_path, "sha256"),
    }
    write_json(manifest_path, manifest)
    log.info("%s: %d train / %d test from %s", name, len(x_train), len(x_test), source)
    return manifest


def load(out_dir: Path, name: str) -> Dataset:
    """Read a prepared dataset; raise DataUnavailable(reason) if it could not be prepared."""
    out_dir = Path(out_dir)
    manifest_path, npz_path = out_dir / f"{name}.json", out_dir / f"{name}.npz"
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError as e:
        raise DataError(f"{manifest_path} does not exist: prepare dataset {name!r} first") from e
    except json.JSONDecodeError as e:
        raise DataError(f"{manifest_path} is not valid JSON: {e}") from e
    if manifest.get("status") != "ok":
        raise DataUnavailable(manifest.get("reason") or f"dataset {name!r} is unavailable")
    try:
        with np.load(npz_path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    except (OSError, KeyError, ValueError) as e:
        raise DataError(f"{npz_path} can't be read ({e}); re-run the data rule") from e
    if len(arrays["x_train"]) != manifest["n_train"] or len(arrays["x_test"]) != manifest["n_test"]:
        raise DataError(f"{npz_path} does not match {manifest_path}; re-run the data rule")
    return Dataset(manifest=manifest, **arrays)


def verify(out_dir: Path, name: str) -> None:
    """Check a prepared dataset's .npz against the SHA-256 its manifest records."""
    manifest_path, npz_path = Path(out_dir) / f"{name}.json", Path(out_dir) / f"{name}.npz"
    expected = json.loads(manifest_path.read_text())["sha256"]
    redo = f"re-create it: snakemake --forcerun {manifest_path}"
    if not npz_path.is_file():
        raise DataError(
            f"{npz_path} is missing, but {manifest_path} records it (sha256 {expected}); {redo}"
        )
    actual = _file_digest(npz_path, "sha256")
    if actual != expected:
        raise DataError(
            f"{npz_path} is corrupt or was changed after it was prepared: sha256 {actual}, "
            f"expected {expected} (recorded in {manifest_path}); {redo}"
        )


def main_from_snakemake(snakemake: Any, log_file: Any) -> None:
    """Entry of the `prepare_data` rule (workflow/scripts/prepare_data.py): prepare the dataset
    the wildcard names into the folder of `output.manifest`. It logs through `logging` into
    the rule's log, open as `log_file` (dmls.joblog)."""
    name = snakemake.wildcards.dataset
    manifest_path = Path(snakemake.output.manifest)
    if manifest_path.name != f"{name}.json":
        raise ValueError(f"output.manifest must be <out_dir>/{name}.json, got {manifest_path}")
    prepare(
        name,
        snakemake.config["data"].get(name, {}),
        manifest_path.parent,
        snakemake.config.get("strict", False),
    )
