"""Python's bytecode cache for the processes a job starts: config `runtime.bytecode_cache`, off
unless asked for. Torch-free: the Snakefile and the bench scripts use it before torch loads.

A job starts several Python processes (the launcher's agent, one per rank), each importing
torch, sympy and torch._dynamo: thousands of modules. A usual install has their compiled
bytecode beside the sources (pip compiles at install time). Some images ship packages without
it and forbid writing it (PYTHONDONTWRITEBYTECODE=1, read-only installs); there every process
compiles every module again, seconds per process (docs/performance.md, "Launch overhead").
With the setting on, a job's processes get a cache of this user's (PYTHONPYCACHEPREFIX) and may
write there; the user's own environment is never changed.

    eval "$(python3 workflow/scripts/dmls/bytecode.py)"   # the same for a shell's processes
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

PACKAGE = "torch"  # the package every job imports and whose bytecode is checked


def default_cache() -> Path:
    """This user's cache folder for the bytecode (XDG's cache home, else ~/.cache)."""
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(home) / "dmls" / "pycache"


def uncached(environ: Mapping[str, str], origin: str | None) -> bool:
    """Whether the module whose source is `origin` has no bytecode beside it and none can be
    written there, in environment `environ` (without a PYTHONPYCACHEPREFIX of its own)."""
    if origin is None or not origin.endswith(".py") or environ.get("PYTHONPYCACHEPREFIX"):
        return False
    source = Path(origin)
    pyc = source.parent / "__pycache__" / Path(importlib.util.cache_from_source(origin)).name
    if pyc.exists():
        return False
    return bool(environ.get("PYTHONDONTWRITEBYTECODE")) or not os.access(source.parent, os.W_OK)


def environment(cache: Path | None = None) -> dict[str, str]:
    """The variables a job's processes get with the setting on: a cache of their own, and
    writing it allowed (an empty PYTHONDONTWRITEBYTECODE is unset for Python)."""
    cache = cache or default_cache()
    cache.mkdir(parents=True, exist_ok=True)
    return {"PYTHONPYCACHEPREFIX": str(cache), "PYTHONDONTWRITEBYTECODE": ""}


def advice(environ: Mapping[str, str] = os.environ, origin: str | None = None) -> str | None:
    """With the setting off: what it would save here, where PACKAGE has no bytecode and may not
    get any; None where it has."""
    if not uncached(environ, origin or _package_origin()):
        return None
    return (
        f"{PACKAGE} has no compiled bytecode and none may be written beside it: every process "
        "of the DAG compiles its imports again (seconds per process). Cache it with "
        "--config runtime='{bytecode_cache: true}'"
    )


def describe() -> str:
    """Where this process's imports find their bytecode (the bench scripts print it)."""
    if sys.pycache_prefix:
        return f"cached in {sys.pycache_prefix}"
    flags = {"PYTHONDONTWRITEBYTECODE": "1" if sys.dont_write_bytecode else ""}
    if uncached(flags, _package_origin()):
        return f"not cached: every process compiles {PACKAGE}'s modules again"
    return "cached beside the sources"


def _package_origin() -> str | None:
    """Where PACKAGE's `__init__.py` is (found without importing it), None if not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    return spec.origin if spec is not None else None


if __name__ == "__main__":
    if advice() is not None:
        for name, value in environment().items():
            print(f"export {name}={shlex.quote(value)}")
