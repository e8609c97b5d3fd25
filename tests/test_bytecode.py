"""The bytecode cache the DAG's processes get where torch has none (dmls/bytecode.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dmls import bytecode

ROOT = Path(__file__).resolve().parents[1]


def _without_bytecode_settings() -> dict[str, str]:
    drop = {"PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX"}
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.fixture
def package(tmp_path):
    """A package without bytecode beside its source, as the lent GPU hosts ship torch."""
    pkg = tmp_path / "site" / "uncompiled"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 42\n")
    return pkg / "__init__.py"


def test_a_package_without_bytecode_that_may_not_write_it_is_uncached(package, monkeypatch):
    assert bytecode.uncached({"PYTHONDONTWRITEBYTECODE": "1"}, str(package))
    # Its folder read-only (what root can't see through os.access, so asked directly).
    monkeypatch.setattr(bytecode.os, "access", lambda path, mode: False)
    assert bytecode.uncached({}, str(package))


def test_bytecode_beside_the_source_a_writable_folder_or_a_prefix_of_its_own_is_left_alone(
    package, tmp_path
):
    # Writable and bytecode allowed: the first process writes it.
    assert not bytecode.uncached({}, str(package))
    # A prefix of the environment's own.
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(tmp_path / "elsewhere")}
    assert not bytecode.uncached(env, str(package))
    # Compiled beside the source.
    env = _without_bytecode_settings() | {"PYTHONPATH": str(package.parents[1])}
    subprocess.run([sys.executable, "-c", "import uncompiled"], check=True, env=env)
    assert list((package.parent / "__pycache__").glob("__init__.*.pyc"))
    assert not bytecode.uncached({"PYTHONDONTWRITEBYTECODE": "1"}, str(package))
    # Nothing to compile: an extension module, or no module.
    assert not bytecode.uncached({"PYTHONDONTWRITEBYTECODE": "1"}, "/x/_C.cpython-311.so")
    assert not bytecode.uncached({"PYTHONDONTWRITEBYTECODE": "1"}, None)


def test_the_setting_lets_a_jobs_processes_write_the_cache_where_the_user_forbids_it(
    package, tmp_path
):
    """The user's environment forbids bytecode (PYTHONDONTWRITEBYTECODE=1, as the lent GPU
    hosts set it); a process started with environment() on top writes the package's bytecode
    into the cache, mirroring the source's absolute path, and the source's folder stays as it
    was."""
    user = _without_bytecode_settings() | {"PYTHONDONTWRITEBYTECODE": "1"}
    cache = tmp_path / "cache"
    added = bytecode.environment(cache)
    assert added == {"PYTHONPYCACHEPREFIX": str(cache), "PYTHONDONTWRITEBYTECODE": ""}
    assert user["PYTHONDONTWRITEBYTECODE"] == "1"  # the user's own environment as it was
    paths = os.pathsep.join([str(package.parents[1]), str(ROOT / "workflow" / "scripts")])
    code = "import uncompiled; from dmls import bytecode; print(bytecode.describe())"
    out = subprocess.run([sys.executable, "-c", code], env=user | added | {"PYTHONPATH": paths},
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    assert out.strip() == f"cached in {cache}"
    mirrored = cache / package.parent.relative_to("/")
    assert list((mirrored / "__pycache__").glob("__init__.*.pyc")) or list(
        mirrored.glob("__init__.*.pyc")
    )
    assert not (package.parent / "__pycache__").exists()


def test_the_advice_names_the_setting_only_where_bytecode_is_missing(package):
    note = bytecode.advice({"PYTHONDONTWRITEBYTECODE": "1"}, str(package))
    assert note is not None and "runtime='{bytecode_cache: true}'" in note
    assert bytecode.advice({}, str(package)) is None  # writable: the first process writes it


def test_the_default_cache_is_the_users(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert bytecode.default_cache() == tmp_path / "dmls" / "pycache"
