"""Dataset preparation: read each dataset once into a canonical cached form.

`prepare` writes `<out_dir>/<name>.npz` (x_train, y_train, x_test, y_test) and
`<out_dir>/<name>.json` (the manifest), the `prepare_data` rule's declared outputs, which the
runs that read them declare as inputs: Snakemake's own tracking decides what is prepared and
trained again. `load` reads them back for training. The source formats' readers are in
dmls.data.sources.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dmls.data.sources import (
    FASHION_MNIST_FILES,
    TABULAR_CLASSES,
    TABULAR_FEATURES,
    TABULAR_FILES,
    Arrays,
    DataError,
    file_digest,
    read_cifar10_archive,
    read_fashion_mnist_dir,
    read_tabular_dir,
)
from dmls.files import atomic_write, write_json

log = logging.getLogger(__name__)

DATASETS: tuple[str, ...] = ("cifar10", "fashion_mnist", "tabular", "synthetic_cifar")

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_FILENAME = "cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
FASHION_MNIST_DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"

# Shape facts per dataset, also written into "unavailable" manifests so the engine
# can report what it would have trained on.
_SPECS: dict[str, tuple[list[int], int]] = {
    "cifar10": ([3, 32, 32], 10),
    "fashion_mnist": ([1, 28, 28], 10),
    "tabular": ([TABULAR_FEATURES], TABULAR_CLASSES),
    "synthetic_cifar": ([3, 32, 32], 10),
}


def shape(name: str) -> tuple[list[int], int]:
    """A data set's input shape (C, H, W, or features) and its number of classes."""
    if name not in _SPECS:
        raise ValueError(f"unknown data set {name!r}: one of {sorted(_SPECS)}")
    return _SPECS[name]


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


# --------------------------------------------------------------------------- CIFAR-10


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


def _download_fashion_mnist(cache_dir: Path) -> Path:
    """Seam for tests (monkeypatch this). Returns torchvision's raw folder."""
    from torchvision.datasets import FashionMNIST

    FashionMNIST(str(cache_dir), train=True, download=True)  # fetches all four files
    return cache_dir / "FashionMNIST" / "raw"


def _prepare_fashion_mnist(cfg: dict) -> tuple[Arrays, str]:
    """Fashion-MNIST from the user's folder (`debian_dir`), else Debian's where it is installed,
    else torchvision's download. Only a folder the user set is theirs to get wrong: Debian's
    absent is the usual case on a fresh machine, not an error."""
    own = cfg.get("debian_dir")
    folder = Path(own or FASHION_MNIST_DEBIAN_DIR)
    gz = [folder / f"{stem}.gz" for stem in FASHION_MNIST_FILES]
    present = [p.is_file() for p in gz]
    if all(present):
        # Read Debian's files directly: Debian re-gzips them, so the .gz md5s differ from
        # the upstream ones torchvision checks and torchvision would reject/re-download them.
        label = "Fashion-MNIST IDX files" if own else "Debian dataset-fashion-mnist"
        return read_fashion_mnist_dir(folder), f"{label} {folder}"
    if any(present):
        missing = [p.name for p, ok in zip(gz, present, strict=True) if not ok]
        key = "data.fashion_mnist.debian_dir" if own else "Debian's dataset-fashion-mnist"
        raise DataError(f"{key} {folder} lacks {', '.join(missing)}")

    where = (
        f"data.fashion_mnist.debian_dir {folder} lacks the IDX files"
        if own
        else f"Debian's dataset-fashion-mnist is not installed ({folder})"
    )
    how = (
        "apt-get install dataset-fashion-mnist, or set data.fashion_mnist.debian_dir to a "
        f"folder holding the four IDX files ({', '.join(f'{s}.gz' for s in FASHION_MNIST_FILES)})."
    )
    if not cfg.get("download", True):
        raise DataUnavailable(
            f"Fashion-MNIST: {where} and data.fashion_mnist.download is false. {how}"
        )
    cache_dir = Path(cfg.get("cache_dir") or "resources/fashion_mnist")
    try:
        raw = _download_fashion_mnist(cache_dir)
    except Exception as e:  # network down, mirror gone, md5 mismatch, ...
        raise DataUnavailable(
            f"Fashion-MNIST: {where} and the torchvision download failed "
            f"({type(e).__name__}: {e}). {how}"
        ) from e
    return read_fashion_mnist_dir(raw), f"Fashion-MNIST download via torchvision -> {raw}"


# --------------------------------------------------------------------------- synthetic


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


def download_needed(name: str, cfg: dict) -> str | None:
    """Why `prepare` will have to download dataset `name` on this host, for the start-of-DAG
    plan: no file of it here (the user's, Debian's or an earlier download's); None where a copy
    is here, the set is synthetic, or a path the user set is read (or refused) instead."""
    cfg = cfg or {}
    if name == "cifar10" and not cfg.get("archive"):
        cache = Path(cfg.get("cache_dir") or "resources/cifar10") / CIFAR10_FILENAME
        if not cache.is_file():
            return f"CIFAR-10: no archive here (data.cifar10.archive is unset, {cache} absent)"
    if name == "fashion_mnist" and not cfg.get("debian_dir"):
        raw = Path(cfg.get("cache_dir") or "resources/fashion_mnist") / "FashionMNIST" / "raw"
        if not any(
            all((folder / f"{stem}.gz").is_file() for stem in FASHION_MNIST_FILES)
            for folder in (Path(FASHION_MNIST_DEBIAN_DIR), raw)
        ):
            return (
                f"Fashion-MNIST: Debian's dataset-fashion-mnist is not installed "
                f"(no IDX files in {FASHION_MNIST_DEBIAN_DIR}) and no earlier download is in {raw}"
            )
    return None


# The config keys that name a user's own files or folders, per dataset.
USER_PATHS = {"tabular": ("dir",), "cifar10": ("archive",), "fashion_mnist": ("debian_dir",)}


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    return file_digest(Path(path), "sha256")


def source_digests(name: str, cfg: dict) -> dict[str, str]:
    """The SHA-256 of each of the user's files dataset `name` is read from (`source_files`), by
    path: the data's identity before it is prepared. Hashed once per process and file version,
    as Snakemake asks for it at parse time and again per job."""
    digests = {}
    for path in source_files(name, cfg):
        st = path.stat()
        digests[str(path)] = _digest(str(path), st.st_size, st.st_mtime_ns)
    return digests


def _read_source(name: str, cfg: dict) -> None:
    """Read the user's files of `name` as `prepare` will (raises DataError naming the file)."""
    if name == "tabular":
        read_tabular_dir(Path(cfg["dir"]))
    elif name == "cifar10":
        read_cifar10_archive(Path(cfg["archive"]), cfg.get("md5", CIFAR10_MD5))
    elif name == "fashion_mnist":
        directory = Path(cfg["debian_dir"])
        present = [(directory / f"{stem}.gz").is_file() for stem in FASHION_MNIST_FILES]
        if all(present):
            read_fashion_mnist_dir(directory)
        elif any(present):  # none at all falls back to the download, as in `prepare`
            missing = [s for s, ok in zip(FASHION_MNIST_FILES, present, strict=True) if not ok]
            raise DataError(f"{directory} lacks {', '.join(f'{s}.gz' for s in missing)}")


def source_problems(data_config: dict, checked_dir: Path) -> list[str]:
    """What is wrong with each of the user's configured data paths (config `data`), with its
    key: a path that names nothing, or files that exist but can't be read (a damaged archive,
    an array of the wrong shape). Checked before any job: a `prepare_data` that fails loses
    its previous outputs, and the runs that trained on them would all be queued again.
    Reading is what `prepare` does, so it is done once per content: `checked_dir` keeps a
    marker per set of files read without a problem, named by their SHA-256."""
    problems = []
    for name, keys in USER_PATHS.items():
        cfg = data_config.get(name) or {}
        for key in keys:
            if not (path := cfg.get(key)):
                continue
            if not Path(path).exists():
                problems.append(f"data.{name}.{key}: {path} does not exist")
                continue
            identity = json.dumps([name, cfg.get("md5"), source_digests(name, cfg)], sort_keys=True)
            marker = Path(checked_dir) / hashlib.sha256(identity.encode()).hexdigest()
            if marker.exists():
                continue
            try:
                _read_source(name, cfg)
            except DataError as e:
                problems.append(f"data.{name}.{key}: {e}")
                continue
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(identity + "\n")
    return problems


def prepared_files(out_dir: Path, name: str) -> tuple[Path, Path]:
    """Dataset `name`'s manifest and arrays in `out_dir`, the same two files for every dataset:
    what `prepare` writes (the `prepare_data` rule's outputs) and `load` reads."""
    return Path(out_dir) / f"{name}.json", Path(out_dir) / f"{name}.npz"


def prepare(name: str, cfg: dict, out_dir: Path, strict: bool = False) -> dict:
    """Write <out_dir>/<name>.npz and <name>.json; return the manifest.

    Data that can't be obtained here leaves an empty <name>.npz, which its manifest marks
    unavailable (with the reason, for the runs to be skipped with): the file is a declared
    output, and a stale copy of real data must not outlive that manifest. `load` reads the
    manifest first and never opens it. The manifest's SHA-256 of the arrays, computed here once,
    is the data's identity in a run's checkpoint (dmls.training.checkpoint).
    DataError always propagates; DataUnavailable propagates only when strict.
    """
    cfg = dict(cfg or {})
    manifest_path, npz_path = prepared_files(out_dir, name)
    input_shape, num_classes = _SPECS.get(name, ([], 0))
    try:
        (x_train, y_train, x_test, y_test), source, synthetic = _obtain(name, cfg)
    except DataUnavailable as e:
        if strict:
            raise
        log.warning("%s unavailable: %s", name, e)
        atomic_write(npz_path, lambda f: None)
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
    arrays: dict[str, Any] = {
        "x_train": x_train,
        "y_train": y_train,
        "x_test": x_test,
        "y_test": y_test,
    }
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
        "sha256": file_digest(npz_path, "sha256"),
    }
    write_json(manifest_path, manifest)
    log.info("%s: %d train / %d test from %s", name, len(x_train), len(x_test), source)
    return manifest


def load(out_dir: Path, name: str) -> Dataset:
    """Read a prepared dataset; raise DataUnavailable(reason) if it could not be prepared."""
    manifest_path, npz_path = prepared_files(out_dir, name)
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


def main_from_snakemake(snakemake: Any, log_file: Any) -> None:
    """Entry of the `prepare_data` rule (workflow/scripts/prepare_data.py): prepare the dataset
    the wildcard names into the folder of `output.manifest`. It logs through `logging` into
    the rule's log, open as `log_file` (dmls.joblog)."""
    name = snakemake.wildcards.dataset
    manifest_path, arrays_path = Path(snakemake.output.manifest), Path(snakemake.output.arrays)
    if (manifest_path, arrays_path) != prepared_files(manifest_path.parent, name):
        raise ValueError(
            f"the outputs must be <out_dir>/{name}.json and <out_dir>/{name}.npz, "
            f"got {manifest_path} and {arrays_path}"
        )
    prepare(
        name,
        snakemake.config["data"].get(name, {}),
        manifest_path.parent,
        snakemake.config.get("strict", False),
    )
