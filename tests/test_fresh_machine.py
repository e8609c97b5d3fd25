"""The README's commands on a machine that has only what the README installs: none of Debian's
datasets, no Java, no Slurm. What the development machine and CI have besides is hidden in a
private mount namespace (`unshare -m`, as root: an empty folder or /dev/null mounted over it),
and the network is taken away with a network namespace of its own (`unshare -n`), so "offline"
is what the test sees whatever the machine it runs on can reach."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from dmls.data import datasets, sources

BIN = Path(sys.executable).parent
# What a default config names on this machine that a fresh one lacks: Debian's datasets
# (Fashion-MNIST's IDX files), Java (D6's Spark), Slurm's commands (the profile's executor).
HIDDEN_FOLDERS = ("/usr/share/datasets", "/usr/lib/jvm")
HIDDEN_COMMANDS = ("java", "sbatch", "sinfo", "squeue", "srun", "sacct", "scontrol")


def _can_unshare() -> str | None:
    if not shutil.which("unshare"):
        return "util-linux's unshare is not installed"
    probe = subprocess.run(["unshare", "-mn", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare -mn refused: {probe.stderr.strip()}"


pytestmark = pytest.mark.skipif(
    (why := _can_unshare()) is not None, reason=f"a private mount namespace is needed: {why}"
)


def on_a_fresh_machine(command: list[str], tmp_path: Path, timeout: int = 300):
    """`command` run in the repository with what a fresh machine lacks hidden, offline."""
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    mounts = []  # commands first: java's real file is inside /usr/lib/jvm
    for name in HIDDEN_COMMANDS:
        if found := shutil.which(name):  # not executable any more: shutil.which skips it
            mounts.append(f"mount --bind /dev/null {shlex.quote(os.path.realpath(found))}")
    mounts += [f"mount --bind {empty} {d}" for d in HIDDEN_FOLDERS if Path(d).is_dir()]
    # A machine offline still has its loopback (torchrun's rendezvous, gloo): a new network
    # namespace starts with it down.
    script = " && ".join(["ip link set lo up", *mounts, shlex.join(command)])
    return subprocess.run(
        ["unshare", "-mn", "bash", "-c", script],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_the_hidden_things_are_hidden(tmp_path):
    """The namespace is what the rest of this file relies on: Debian's Fashion-MNIST, Java and
    Slurm are gone inside it, no address outside the machine can be reached, and the loopback
    works (ranks rendezvous on it)."""
    probe = (
        "import os, shutil, socket, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'workflow' / 'scripts')!r})\n"
        "from dmls.data.datasets import FASHION_MNIST_DEBIAN_DIR as d\n"
        "print(os.listdir(d) if os.path.isdir(d) else [])\n"
        f"print([shutil.which(c) for c in {HIDDEN_COMMANDS!r}])\n"
        "try:\n    socket.create_connection(('1.1.1.1', 80), timeout=2); print('online')\n"
        "except OSError:\n    print('offline')\n"
        "server = socket.create_server(('127.0.0.1', 0))\n"
        "socket.create_connection(server.getsockname(), timeout=2); print('loopback')\n"
    )
    out = on_a_fresh_machine([sys.executable, "-c", probe], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == [
        "[]",
        str([None] * len(HIDDEN_COMMANDS)),
        "offline",
        "loopback",
    ]


@pytest.mark.parametrize(
    "configfile", [None, "config/cpu.yaml", "config/fashion_mnist.yaml", ".test/config.yaml"]
)
def test_every_config_plans_on_a_fresh_machine(tmp_path, configfile):
    """Before, the schema's default `data.fashion_mnist.debian_dir` was checked as a path the
    user had set, and `snakemake --cores 4` stopped at parse time on every machine without
    Debian's dataset-fashion-mnist ("does not exist")."""
    extra = ["--configfile", configfile] if configfile else []
    out = on_a_fresh_machine(
        [str(BIN / "snakemake"), "-n", "--cores", "4", "--forceall", *extra,
         "--config", f"results_dir={tmp_path / 'results'}"],
        tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "does not exist" not in out.stderr and "prepare_data" in out.stdout


def test_a_folder_the_user_set_that_names_nothing_still_stops_the_plan(tmp_path):
    out = on_a_fresh_machine(
        [str(BIN / "snakemake"), "-n", "--cores", "1",
         "--config", f"results_dir={tmp_path / 'results'}",
         f"data={{'fashion_mnist': {{'debian_dir': '{tmp_path / 'mine'}'}}}}"],
        tmp_path,
    )  # fmt: skip
    assert out.returncode != 0
    said = out.stdout + out.stderr  # Snakemake prints a parse error on stdout
    assert f"data.fashion_mnist.debian_dir: {tmp_path / 'mine'} does not exist" in said


def test_offline_without_debians_package_c_and_d4_are_skipped_with_the_reason(tmp_path):
    """The main command's Fashion-MNIST on a fresh machine, offline: the plan says it will be
    downloaded or skipped, the preparation writes an unavailable manifest naming Debian's
    package and the failed download, and studies C and D4 end skipped with that reason (D4's
    CPU parts once started their ranks and failed in them: 'rank 0 raised DataUnavailable')."""
    results = tmp_path / "results"
    # (D4 waits for the collectives sweep, which has nothing to do with the data: off here.)
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        f"results_dir: {results}\n"
        f"data: {{fashion_mnist: {{cache_dir: {tmp_path / 'cache'}}}}}\n"
        "special_studies: {collectives: {enabled: false}}\n"
    )
    targets = [str(results / "studies" / s / "summary.json") for s in ("fused_conv", "sharding")]
    out = on_a_fresh_machine(
        [str(BIN / "snakemake"), "--cores", "2", "--configfile", str(extra), "--", *targets],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (
        "Fashion-MNIST: Debian's dataset-fashion-mnist is not installed "
        f"(no IDX files in {datasets.FASHION_MNIST_DEBIAN_DIR}) and no earlier download is in "
        f"{tmp_path / 'cache' / 'FashionMNIST' / 'raw'}: prepare_data downloads it; offline, "
        "the runs and studies that need it are skipped with the reason."
    ) in out.stderr
    manifest = json.loads((results / "data" / "fashion_mnist.json").read_text())
    assert manifest["status"] == "unavailable"
    assert manifest["reason"].startswith(
        "Fashion-MNIST: Debian's dataset-fashion-mnist is not installed "
        f"({datasets.FASHION_MNIST_DEBIAN_DIR}) and the torchvision download failed ("
    )
    assert "apt-get install dataset-fashion-mnist" in manifest["reason"]
    summary = json.loads((results / "studies" / "fused_conv" / "summary.json").read_text())
    assert summary["status"] == "skipped", summary
    assert "dataset fashion_mnist unavailable: Fashion-MNIST: Debian's" in out.stderr
    sharding = json.loads((results / "studies" / "sharding" / "summary.json").read_text())
    cpu = [r for r in sharding["rows"] if r["device"] == "cpu"]
    assert cpu and all(r["status"] == "skipped" for r in cpu), cpu
    assert all(r["reason"].startswith("dataset fashion_mnist unavailable: ") for r in cpu)


def _idx_files(folder: Path) -> None:
    """The four Fashion-MNIST IDX files, tiny, as torchvision's download leaves them."""
    import gzip

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for stem in sources.FASHION_MNIST_FILES:
        n = 6 if stem.startswith("train") else 4
        if "images" in stem:
            head, body = np.array([2051, n, 28, 28], ">u4"), rng.integers(0, 256, (n, 28, 28))
        else:
            head, body = np.array([2049, n], ">u4"), rng.integers(0, 10, n)
        with gzip.open(folder / f"{stem}.gz", "wb") as f:
            f.write(head.tobytes() + body.astype(np.uint8).tobytes())


def test_online_without_debians_package_fashion_mnist_is_downloaded(tmp_path, monkeypatch):
    """Online, the same default config reads what torchvision's download brings (the download
    stood in for: it writes the files torchvision would), and the plan's line goes once the
    download is in its cache."""
    monkeypatch.setattr(datasets, "FASHION_MNIST_DEBIAN_DIR", str(tmp_path / "not-installed"))
    cfg = {"debian_dir": None, "download": True, "cache_dir": str(tmp_path / "cache")}
    assert datasets.download_needed("fashion_mnist", cfg).startswith(
        "Fashion-MNIST: Debian's dataset-fashion-mnist is not installed"
    )
    fetched = []

    def download(cache_dir: Path) -> Path:
        fetched.append(cache_dir)
        _idx_files(cache_dir / "FashionMNIST" / "raw")
        return cache_dir / "FashionMNIST" / "raw"

    monkeypatch.setattr(datasets, "_download_fashion_mnist", download)
    manifest = datasets.prepare("fashion_mnist", cfg, tmp_path / "out")
    assert fetched == [tmp_path / "cache"]
    assert manifest["status"] == "ok" and manifest["n_train"] == 6 and manifest["n_test"] == 4
    assert manifest["source"] == (
        f"Fashion-MNIST download via torchvision -> {tmp_path / 'cache' / 'FashionMNIST' / 'raw'}"
    )
    assert datasets.download_needed("fashion_mnist", cfg) is None
