"""Tests for dmls.data.datasets and dmls.data.sources: readers, prepare/load round trips,
error messages, synthetic sets."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import re
import struct
import tarfile
import urllib.error
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from datafiles import write_cifar10_archive
from dmls.data import datasets, sources
from dmls.data.datasets import DataUnavailable
from dmls.data.sources import DataError

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")


# --------------------------------------------------------------------------- helpers


def _tiny_cifar(seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    x_train = rng.integers(0, 256, (20, 3, 32, 32), dtype=np.uint8)
    y_train = rng.integers(0, 10, 20).astype(np.int64)
    x_test = rng.integers(0, 256, (6, 3, 32, 32), dtype=np.uint8)
    y_test = rng.integers(0, 10, 6).astype(np.int64)
    return x_train, y_train, x_test, y_test


def _write_idx(path: Path, arr: np.ndarray, compress: bool = True) -> None:
    """IDX format: 0x0000, type 0x08 (ubyte), ndim, big-endian uint32 dims, then the bytes."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    blob = struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    blob += arr.tobytes()
    if compress:
        path.write_bytes(gzip.compress(blob))
    else:
        path.write_bytes(blob)


def _write_fashion_dir(d: Path, n_train: int = 7, n_test: int = 3) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(1)
    arrays = (
        rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, n_train).astype(np.uint8),
        rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, n_test).astype(np.uint8),
    )
    d.mkdir(parents=True, exist_ok=True)
    for stem, arr in zip(sources.FASHION_MNIST_FILES, arrays, strict=True):
        _write_idx(d / f"{stem}.gz", arr)
    return arrays


def _write_tabular(d: Path, **override: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    arrays = {
        "train_x.npy": rng.standard_normal((30, 512)).astype(np.float32),
        "train_y.npy": rng.integers(0, 20, 30),
        "test_x.npy": rng.standard_normal((10, 512)),  # float64 on purpose: cast to float32
        "test_y.npy": rng.integers(0, 20, 10).astype(np.int32),
    }
    arrays.update({f"{k}.npy": v for k, v in override.items()})
    d.mkdir(parents=True, exist_ok=True)
    for fname, arr in arrays.items():
        np.save(d / fname, arr)
    return arrays


def _replace_members(archive: Path, new: dict[str, bytes]) -> None:
    """Rewrite a CIFAR archive with some batch members' pickles replaced."""
    with tarfile.open(archive, "r:gz") as src:
        members = [(m, src.extractfile(m).read()) for m in src.getmembers()]
    with tarfile.open(archive, "w:gz") as dst:
        for m, blob in members:
            name = m.name.rsplit("/", 1)[-1]
            if name in new:
                blob, m.size = new[name], len(new[name])
            dst.addfile(m, io.BytesIO(blob))


def _py2_batch(x: np.ndarray, labels: list[int]) -> bytes:
    """Opcode-level imitation of a Python 2 + numpy 1.x cPickle (protocol 2) CIFAR batch.

    The official archive was pickled that way (str keys -> SHORT_BINSTRING, module path
    numpy.core.multiarray); Python 3 can't produce it, and the archive can't be fetched in CI.
    """

    def s(b: bytes) -> bytes:
        return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<I", len(b)) + b

    def i(v: int) -> bytes:
        return b"K" + bytes([v]) if 0 <= v < 256 else b"J" + struct.pack("<i", v)

    raw = np.ascontiguousarray(x, np.uint8).tobytes()
    dtype = b"cnumpy\ndtype\n" + s(b"u1") + i(0) + i(1) + b"\x87R"
    dtype += b"(" + i(3) + s(b"|") + b"NNN" + i(-1) + i(-1) + i(0) + b"tb"
    arr = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + i(0) + b"\x85"
    arr += s(b"b") + b"\x87R(" + i(1) + i(x.shape[0]) + i(x.shape[1]) + b"\x86" + dtype
    arr += b"\x89" + s(raw) + b"tb"
    lab = b"](" + b"".join(i(v) for v in labels) + b"e"
    return b"\x80\x02}(" + s(b"data") + arr + s(b"labels") + lab + b"u."


@pytest.fixture
def no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(datasets, "_download_url", offline)
    monkeypatch.setattr(datasets, "_download_fashion_mnist", offline)


# --------------------------------------------------------------------------- CIFAR-10


def test_cifar10_archive_round_trip(tmp_path: Path) -> None:
    arrays = _tiny_cifar()
    archive = tmp_path / "cifar-10-python.tar.gz"
    md5 = write_cifar10_archive(archive, *arrays)
    assert md5 == sources.file_digest(archive, "md5")
    # Deterministic writer: same arrays, same bytes.
    assert write_cifar10_archive(tmp_path / "again.tar.gz", *arrays) == md5

    out = tmp_path / "prepared"
    manifest = datasets.prepare("cifar10", {"archive": str(archive), "md5": md5}, out)
    assert manifest["status"] == "ok" and manifest["reason"] is None
    assert manifest["synthetic"] is False
    assert manifest["n_train"] == 20 and manifest["n_test"] == 6
    assert manifest["input_shape"] == [3, 32, 32] and manifest["num_classes"] == 10
    assert str(archive) in manifest["source"] and "md5 ok" in manifest["source"]
    assert manifest["sha256"] == sources.file_digest(out / "cifar10.npz", "sha256")
    assert json.loads((out / "cifar10.json").read_text()) == manifest

    ds = datasets.load(out, "cifar10")
    for got, want in zip((ds.x_train, ds.y_train, ds.x_test, ds.y_test), arrays, strict=True):
        np.testing.assert_array_equal(got, want)
    assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int64
    assert ds.manifest == manifest
    # Per-channel stats on [0,1]-scaled train pixels.
    scaled = arrays[0].astype(np.float64) / 255.0
    np.testing.assert_allclose(manifest["mean"], scaled.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(manifest["std"], scaled.std(axis=(0, 2, 3)), rtol=1e-9)
    # No temp files left behind by the atomic writes.
    assert sorted(p.name for p in out.iterdir()) == ["cifar10.json", "cifar10.npz"]


def test_cifar10_archive_without_md5_check(tmp_path: Path) -> None:
    archive = tmp_path / "c.tar.gz"
    write_cifar10_archive(archive, *_tiny_cifar())
    x_train, *_ = sources.read_cifar10_archive(archive, None)
    assert x_train.shape == (20, 3, 32, 32)


def test_cifar10_corrupt_archive_names_file_and_md5s(tmp_path: Path) -> None:
    archive = tmp_path / "cifar-10-python.tar.gz"
    md5 = write_cifar10_archive(archive, *_tiny_cifar())
    blob = bytearray(archive.read_bytes())
    for i in range(100, 110):
        blob[i] ^= 0xFF
    archive.write_bytes(bytes(blob))
    actual = sources.file_digest(archive, "md5")
    with pytest.raises(DataError) as e:
        datasets.prepare("cifar10", {"archive": str(archive), "md5": md5}, tmp_path / "out")
    msg = str(e.value)
    assert str(archive) in msg and md5 in msg and actual in msg
    # No checksum given: the corruption is still caught by the reader, naming the file.
    with pytest.raises(DataError, match=r"cifar-10-python\.tar\.gz"):
        sources.read_cifar10_archive(archive, None)


def test_cifar10_missing_archive_names_config_key(tmp_path: Path) -> None:
    missing = tmp_path / "nope.tar.gz"
    with pytest.raises(DataError) as e:
        datasets.prepare("cifar10", {"archive": str(missing)}, tmp_path / "out")
    assert "data.cifar10.archive" in str(e.value) and str(missing) in str(e.value)
    assert not (tmp_path / "out" / "cifar10.npz").exists()


def test_cifar10_bad_member_shape(tmp_path: Path) -> None:
    x_train, y_train, x_test, y_test = _tiny_cifar()
    archive = tmp_path / "c.tar.gz"
    write_cifar10_archive(archive, x_train, y_train, x_test, y_test)
    bad = pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, protocol=2)
    _replace_members(archive, {"test_batch": bad})
    with pytest.raises(DataError, match=r"test_batch.*\(2, 100\)"):
        sources.read_cifar10_archive(archive, None)


def test_cifar10_python2_pickles(tmp_path: Path) -> None:
    x_train, y_train, x_test, y_test = _tiny_cifar()
    archive = tmp_path / "c.tar.gz"
    write_cifar10_archive(archive, x_train, y_train, x_test, y_test)
    flat_train = x_train.reshape(20, 3072)
    new = {
        f"data_batch_{k + 1}": _py2_batch(flat_train[4 * k : 4 * k + 4], y_train[4 * k : 4 * k + 4])
        for k in range(5)
    }
    # Python 3 protocol 2 (bytes via _codecs.encode), as a repacked archive might hold.
    new["test_batch"] = pickle.dumps(
        {b"data": x_test.reshape(6, 3072), b"labels": y_test.tolist()}, protocol=2
    )
    _replace_members(archive, new)
    got = sources.read_cifar10_archive(archive, None)
    for g, w in zip(got, (x_train, y_train, x_test, y_test), strict=True):
        np.testing.assert_array_equal(g, w)


def test_cifar10_refuses_code_in_pickles(tmp_path: Path) -> None:
    archive = tmp_path / "c.tar.gz"
    write_cifar10_archive(archive, *_tiny_cifar())
    evil = b"\x80\x02cos\nsystem\nU\x04trueq\x00\x85R."  # os.system("true")
    _replace_members(archive, {"data_batch_3": evil})
    with pytest.raises(DataError, match=r"data_batch_3 is not a valid pickle.*os\.system"):
        sources.read_cifar10_archive(archive, None)


def test_cifar10_download_offline(tmp_path: Path, no_download: None) -> None:
    out = tmp_path / "out"
    (out).mkdir()
    (out / "cifar10.npz").write_bytes(b"stale")
    cfg = {"cache_dir": str(tmp_path / "cache")}
    manifest = datasets.prepare("cifar10", cfg, out, strict=False)
    assert manifest["status"] == "unavailable"
    reason = manifest["reason"]
    assert "data.cifar10.archive" in reason and datasets.CIFAR10_MD5 in reason
    assert datasets.CIFAR10_URL in reason and "URLError" in reason
    assert json.loads((out / "cifar10.json").read_text()) == manifest
    assert (out / "cifar10.npz").read_bytes() == b""  # stale npz replaced by the placeholder
    with pytest.raises(DataUnavailable, match=r"data\.cifar10\.archive"):
        datasets.load(out, "cifar10")
    with pytest.raises(DataUnavailable, match=datasets.CIFAR10_MD5):
        datasets.prepare("cifar10", cfg, tmp_path / "strict", strict=True)


def test_cifar10_download_disabled(tmp_path: Path) -> None:
    manifest = datasets.prepare("cifar10", {"download": False}, tmp_path)
    assert manifest["status"] == "unavailable" and "download is false" in manifest["reason"]


def test_cifar10_download_uses_same_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = _tiny_cifar(3)
    src = tmp_path / "src.tar.gz"
    md5 = write_cifar10_archive(src, *arrays)
    calls = []

    def fake_download(url: str, root: str, filename: str, md5: str | None) -> None:
        calls.append((url, filename, md5))
        Path(root).mkdir(parents=True, exist_ok=True)
        (Path(root) / filename).write_bytes(src.read_bytes())

    monkeypatch.setattr(datasets, "_download_url", fake_download)
    cfg = {"md5": md5, "cache_dir": str(tmp_path / "cache")}
    manifest = datasets.prepare("cifar10", cfg, tmp_path / "out")
    assert calls == [(datasets.CIFAR10_URL, "cifar-10-python.tar.gz", md5)]
    assert manifest["status"] == "ok" and manifest["n_train"] == 20
    np.testing.assert_array_equal(datasets.load(tmp_path / "out", "cifar10").x_test, arrays[2])


# --------------------------------------------------------------------------- IDX / Fashion-MNIST


@pytest.mark.parametrize("compress", [True, False])
def test_read_idx(tmp_path: Path, compress: bool) -> None:
    images = np.arange(2 * 28 * 28, dtype=np.int64).reshape(2, 28, 28).astype(np.uint8)
    labels = np.array([3, 9, 0], dtype=np.uint8)
    _write_idx(tmp_path / "img", images, compress)
    _write_idx(tmp_path / "lbl", labels, compress)
    got = sources.read_idx(tmp_path / "img")
    assert got.shape == (2, 28, 28) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, images)
    np.testing.assert_array_equal(sources.read_idx(tmp_path / "lbl"), labels)


def test_read_idx_truncated_and_bad_magic(tmp_path: Path) -> None:
    p = tmp_path / "img.gz"
    _write_idx(p, np.zeros((2, 28, 28), np.uint8))
    p.write_bytes(gzip.compress(gzip.decompress(p.read_bytes())[:-5]))
    with pytest.raises(DataError, match=r"img\.gz.*1568 data bytes, found 1563"):
        sources.read_idx(p)
    q = tmp_path / "junk"
    q.write_bytes(b"\x12\x34\x08\x01" + b"\x00" * 8)
    with pytest.raises(DataError, match="junk: bad magic"):
        sources.read_idx(q)


def test_read_fashion_mnist_dir(tmp_path: Path) -> None:
    xtr, ytr, _, yte = _write_fashion_dir(tmp_path / "fm")
    got = sources.read_fashion_mnist_dir(tmp_path / "fm")
    assert got[0].shape == (7, 1, 28, 28) and got[2].shape == (3, 1, 28, 28)
    np.testing.assert_array_equal(got[0][:, 0], xtr)
    np.testing.assert_array_equal(got[1], ytr)
    np.testing.assert_array_equal(got[3], yte)
    assert got[1].dtype == np.int64


def test_prepare_fashion_mnist_from_dir(tmp_path: Path, no_download: None) -> None:
    _write_fashion_dir(tmp_path / "fm")
    manifest = datasets.prepare(
        "fashion_mnist", {"debian_dir": str(tmp_path / "fm")}, tmp_path / "o"
    )
    assert manifest["status"] == "ok" and manifest["synthetic"] is False
    assert manifest["input_shape"] == [1, 28, 28] and manifest["n_train"] == 7
    assert len(manifest["mean"]) == 1 and str(tmp_path / "fm") in manifest["source"]
    assert datasets.load(tmp_path / "o", "fashion_mnist").x_train.shape == (7, 1, 28, 28)


def test_prepare_fashion_mnist_unavailable(tmp_path: Path, no_download: None) -> None:
    cfg = {"debian_dir": str(tmp_path / "absent"), "cache_dir": str(tmp_path / "cache")}
    manifest = datasets.prepare("fashion_mnist", cfg, tmp_path / "o")
    assert manifest["status"] == "unavailable"
    assert "apt-get install dataset-fashion-mnist" in manifest["reason"]
    assert "data.fashion_mnist.debian_dir" in manifest["reason"]
    with pytest.raises(DataUnavailable, match="apt-get install dataset-fashion-mnist"):
        datasets.prepare("fashion_mnist", cfg, tmp_path / "o", strict=True)


def test_fashion_mnist_labels_out_of_range(tmp_path: Path) -> None:
    _write_fashion_dir(tmp_path / "fm")
    _write_idx(tmp_path / "fm" / "t10k-labels-idx1-ubyte.gz", np.array([1, 2, 12], np.uint8))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\.gz.*\[0, 10\)"):
        sources.read_fashion_mnist_dir(tmp_path / "fm")


def test_debian_fashion_mnist_real_files() -> None:
    if not DEBIAN_FASHION.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{DEBIAN_FASHION} missing: CI must apt-get install dataset-fashion-mnist")
        pytest.skip(f"{DEBIAN_FASHION} absent (apt-get install dataset-fashion-mnist)")
    x_train, y_train, x_test, y_test = sources.read_fashion_mnist_dir(DEBIAN_FASHION)
    assert x_train.shape == (60000, 1, 28, 28) and x_test.shape == (10000, 1, 28, 28)
    assert x_train.dtype == np.uint8
    assert set(np.unique(y_train)) == set(range(10)) == set(np.unique(y_test))
    assert np.bincount(y_train).tolist() == [6000] * 10  # Fashion-MNIST is balanced


# --------------------------------------------------------------------------- tabular .npy


def test_tabular_round_trip(tmp_path: Path) -> None:
    arrays = _write_tabular(tmp_path / "tab")
    manifest = datasets.prepare("tabular", {"dir": str(tmp_path / "tab")}, tmp_path / "o")
    assert manifest["status"] == "ok" and manifest["synthetic"] is False
    assert manifest["input_shape"] == [512] and manifest["num_classes"] == 20
    assert manifest["mean"] is None and manifest["std"] is None
    ds = datasets.load(tmp_path / "o", "tabular")
    assert ds.x_test.dtype == np.float32 and ds.y_test.dtype == np.int64
    np.testing.assert_array_equal(ds.x_train, arrays["train_x.npy"])
    np.testing.assert_array_equal(ds.x_test, arrays["test_x.npy"].astype(np.float32))
    np.testing.assert_array_equal(ds.y_test, arrays["test_y.npy"])


def test_tabular_wrong_shape_or_dtype_names_the_file_and_shapes(tmp_path: Path) -> None:
    cases = [
        ({"train_x": np.zeros((30, 100), np.float32)},
         "train_x.npy: shape (30, 100), expected (N, 512) with N > 0"),
        ({"train_x": np.zeros((30, 512), np.int64)},
         "train_x.npy: dtype int64, expected a floating dtype (e.g. float32)"),
        ({"test_y": np.zeros((10, 2), np.int64)},
         "test_y.npy: shape (10, 2), expected (10,) to match test_x.npy"),
    ]  # fmt: skip
    for override, message in cases:
        _write_tabular(tmp_path, **override)
        with pytest.raises(DataError) as e:
            sources.read_tabular_dir(tmp_path)
        assert str(e.value) == f"{tmp_path}/{message}"


def test_tabular_float_labels(tmp_path: Path) -> None:
    _write_tabular(tmp_path, test_y=np.zeros(10, np.float64))
    with pytest.raises(DataError, match=r"test_y\.npy: dtype float64, expected an integer"):
        sources.read_tabular_dir(tmp_path)


def test_tabular_labels_out_of_range(tmp_path: Path) -> None:
    _write_tabular(tmp_path, train_y=np.arange(30))
    with pytest.raises(
        DataError, match=r"train_y\.npy: labels range \[0, 29\], expected \[0, 20\)"
    ):
        sources.read_tabular_dir(tmp_path)


def test_tabular_length_mismatch_and_int_x(tmp_path: Path) -> None:
    _write_tabular(tmp_path, train_y=np.zeros(29, np.int64))
    with pytest.raises(DataError, match=r"train_y\.npy: shape \(29,\), expected \(30,\)"):
        sources.read_tabular_dir(tmp_path)
    _write_tabular(tmp_path, train_x=np.zeros((30, 512), np.int64))
    with pytest.raises(DataError, match=r"train_x\.npy: dtype int64"):
        sources.read_tabular_dir(tmp_path)


def test_tabular_missing_file(tmp_path: Path) -> None:
    _write_tabular(tmp_path)
    (tmp_path / "test_x.npy").unlink()
    with pytest.raises(DataError, match=r"test_x\.npy does not exist"):
        datasets.prepare("tabular", {"dir": str(tmp_path)}, tmp_path / "o", strict=False)


# --------------------------------------------------------------------------- synthetic


def test_synthetic_tabular_deterministic() -> None:
    a = datasets.make_synthetic_tabular(200, 100, seed=5)
    b = datasets.make_synthetic_tabular(200, 100, seed=5)
    c = datasets.make_synthetic_tabular(200, 100, seed=6)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])
    x_train, y_train, x_test, y_test = a
    assert x_train.shape == (200, 512) and x_test.shape == (100, 512)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    assert set(y_train.tolist()) == set(range(20)) == set(y_test.tolist())


def test_synthetic_images_deterministic() -> None:
    a = datasets.make_synthetic_images(50, 20, seed=1)
    b = datasets.make_synthetic_images(50, 20, seed=1)
    c = datasets.make_synthetic_images(50, 20, seed=2)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])
    assert a[0].shape == (50, 3, 32, 32) and a[0].dtype == np.uint8 and a[1].dtype == np.int64
    assert set(a[1].tolist()) == set(range(10)) == set(a[3].tolist())
    gray = datasets.make_synthetic_images(4, 2, shape=(1, 28, 28), seed=0)
    assert gray[0].shape == (4, 1, 28, 28)


def test_prepare_synthetic_cifar_and_tabular(tmp_path: Path) -> None:
    m = datasets.prepare("synthetic_cifar", {"n_train": 40, "n_test": 20, "seed": 3}, tmp_path)
    assert m["status"] == "ok" and m["synthetic"] is True and "synthetic" in m["source"]
    assert (m["n_train"], m["n_test"], m["input_shape"]) == (40, 20, [3, 32, 32])
    assert len(m["mean"]) == 3 and all(0.3 < v < 0.7 for v in m["mean"])
    ds = datasets.load(tmp_path, "synthetic_cifar")
    np.testing.assert_array_equal(ds.x_train, datasets.make_synthetic_images(40, 20, seed=3)[0])
    # Defaults apply when keys are missing.
    m = datasets.prepare("synthetic_cifar", {}, tmp_path)
    assert (m["n_train"], m["n_test"]) == (512, 256)

    t = datasets.prepare(
        "tabular", {"dir": None, "synthetic": {"n_train": 60, "n_test": 40}}, tmp_path
    )
    assert t["synthetic"] is True and "synthetic" in t["source"] and t["n_train"] == 60


def test_unknown_dataset(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown dataset 'mnist'"):
        datasets.prepare("mnist", {}, tmp_path)


def test_a_missing_or_unreadable_prepared_dataset_names_the_file(tmp_path: Path) -> None:
    """Snakemake prepares missing or replaced arrays again; read outside it, `load` names the
    file that can't be read."""
    datasets.prepare("tabular", {"synthetic": {"n_train": 40, "n_test": 20}}, tmp_path)
    npz = tmp_path / "tabular.npz"
    npz.write_bytes(b"not an npz")
    with pytest.raises(
        DataError, match=rf"{re.escape(str(npz))} can't be read .*re-run the data rule"
    ):
        datasets.load(tmp_path, "tabular")
    npz.unlink()
    with pytest.raises(
        DataError, match=rf"{re.escape(str(npz))} can't be read .*re-run the data rule"
    ):
        datasets.load(tmp_path, "tabular")


def test_the_rule_writes_its_declared_outputs_only(tmp_path: Path) -> None:
    """`prepare_data`'s declared outputs are the files `prepare` writes: both exist after it,
    the arrays empty where the data is unavailable, and other paths are refused."""

    def rule(dataset: str, manifest: Path, arrays: Path, cfg: dict) -> SimpleNamespace:
        return SimpleNamespace(
            wildcards=SimpleNamespace(dataset=dataset),
            output=SimpleNamespace(manifest=str(manifest), arrays=str(arrays)),
            config={"data": {dataset: cfg}, "strict": False},
        )

    out = tmp_path / "data"
    cfg = {"n_train": 20, "n_test": 10}
    datasets.main_from_snakemake(
        rule("synthetic_cifar", out / "synthetic_cifar.json", out / "synthetic_cifar.npz", cfg),
        None,
    )
    manifest = json.loads((out / "synthetic_cifar.json").read_text())
    assert manifest["sha256"] == sources.file_digest(out / "synthetic_cifar.npz", "sha256")
    datasets.main_from_snakemake(
        rule("cifar10", out / "cifar10.json", out / "cifar10.npz", {"download": False}), None
    )
    assert (out / "cifar10.npz").read_bytes() == b""
    assert json.loads((out / "cifar10.json").read_text())["status"] == "unavailable"
    with pytest.raises(ValueError, match=r"<out_dir>/tabular\.json and <out_dir>/tabular\.npz"):
        datasets.main_from_snakemake(
            rule("tabular", out / "tabular.json", out / "tabular-arrays.npz", {}), None
        )


def test_load_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="prepare dataset 'cifar10' first"):
        datasets.load(tmp_path, "cifar10")


def test_synthetic_tabular_learnable() -> None:
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: threads only add overhead and contention
    try:
        torch.manual_seed(0)
        x_train, y_train, x_test, y_test = map(
            torch.from_numpy, datasets.make_synthetic_tabular(4000, 1000)
        )
        model = torch.nn.Sequential(
            torch.nn.Linear(512, 32),
            torch.nn.BatchNorm1d(32),
            torch.nn.ReLU(),
            torch.nn.Linear(32, 20),
        )
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(4):
            model.train()
            for idx in torch.randperm(len(x_train)).split(128):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
                opt.step()
        model.eval()
        with torch.no_grad():
            acc = (model(x_test).argmax(1) == y_test).float().mean().item()
    finally:
        torch.set_num_threads(threads)
    assert 0.5 < acc < 0.97, acc  # chance is 0.05; near-perfect would mean "trivial"


def test_synthetic_images_learnable() -> None:
    x_train, y_train, x_test, y_test = datasets.make_synthetic_images(512, 256, seed=0)
    # Ridge regression to one-hot targets: a linear model on flattened pixels, closed form
    # (dual form: a 512x512 solve instead of 3073x3073).
    a = np.c_[x_train.reshape(len(x_train), -1) / 255.0, np.ones(len(x_train))]
    b = np.c_[x_test.reshape(len(x_test), -1) / 255.0, np.ones(len(x_test))]
    w = a.T @ np.linalg.solve(a @ a.T + 10.0 * np.eye(len(a)), np.eye(10)[y_train])
    acc = float(((b @ w).argmax(1) == y_test).mean())
    assert 0.3 < acc < 0.95, acc  # chance is 0.1


def test_configured_paths_that_name_nothing_are_named_with_their_keys(tmp_path):
    from dmls.data.datasets import source_problems

    (tmp_path / "here").mkdir()
    config = {
        "tabular": {"dir": str(tmp_path / "gone")},
        "cifar10": {"archive": str(tmp_path / "gone.tar.gz")},
        "fashion_mnist": {"debian_dir": None},
    }
    assert source_problems(config, tmp_path / "checked") == [
        f"data.tabular.dir: {tmp_path}/gone does not exist",
        f"data.cifar10.archive: {tmp_path}/gone.tar.gz does not exist",
    ]


def test_user_files_that_cant_be_read_are_named_before_any_job_and_read_once_per_content(
    tmp_path, monkeypatch
):
    from dmls.data import datasets

    source = tmp_path / "tabular"
    source.mkdir()
    for name, array in zip(
        datasets.TABULAR_FILES, datasets.make_synthetic_tabular(40, 20, seed=0), strict=True
    ):
        np.save(source / name, array)
    config, checked = {"tabular": {"dir": str(source)}}, tmp_path / "checked"
    assert datasets.source_problems(config, checked) == []
    assert len(list(checked.iterdir())) == 1  # the marker of this content

    reads = []
    monkeypatch.setattr(datasets, "_read_source", lambda *a: reads.append(a))
    assert datasets.source_problems(config, checked) == [] and reads == []  # read once
    monkeypatch.undo()

    np.save(source / "train_x.npy", np.zeros((40, 7), np.float32))  # a damaged copy
    assert datasets.source_problems(config, checked) == [
        f"data.tabular.dir: {source}/train_x.npy: shape (40, 7), expected (N, 512) with N > 0"
    ]
