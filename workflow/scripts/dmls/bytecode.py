"""Python's bytecode cache for the processes the DAG starts (torch-free: the Snakefile and the
bench scripts call it before anything imports torch).

A training job starts several Python processes (the launcher's agent, one per rank), and each
imports torch, sympy and torch._dynamo: thousands of modules. Python keeps their compiled
bytecode in `__pycache__` folders beside the sources, and a usual install has it (pip compiles
at install time). Some environments have neither the files nor the right to write them:
container images that set PYTHONDONTWRITEBYTECODE=1 and ship packages without their .pyc files,
or read-only installs. There every process compiles every module it imports, again. Measured on
a lent 2× H200 host (torch 2.11, Python 3.12, no .pyc in torch or sympy): `import torch` took
3.3 s instead of 1.9 s with a cache, torchrun's agent 4.9 s instead of 2.1, torch._dynamo 4.1 s
instead of 1.3, and a 15-epoch 2-GPU DDP job spent 16 s outside training instead of 10
(bench/launch_overhead.py) -- a cost of the host's setup, not of the launcher studied.

`cache_bytecode(environ)`: when torch's bytecode is neither cached nor writable beside its
sources, point PYTHONPYCACHEPREFIX at a cache of this user's and let Python write there. The
sources' folders stay as they were (what PYTHONDONTWRITEBYTECODE usually protects). An
environment that sets PYTHONPYCACHEPREFIX itself is left as it is.

    python3 workflow/scripts/dmls/bytecode.py    # the shell lines that do the same (eval them)
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from collections.abc import MutableMapping
from pathlib import Path

PACKAGE = "torch"  # the package every job imports and whose bytecode is checked


def default_cache() -> Path:
    """This user's cache folder for the bytecode (XDG's cache home, else ~/.cache)."""
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(home) / "dmls" / "pycache"


def uncached(environ: MutableMapping[str, str], origin: str | None) -> bool:
    """Whether the module whose source is `origin` has no bytecode beside it and none can be
    written there, in environment `environ` (without a PYTHONPYCACHEPREFIX of its own)."""
    if origin is None or not origin.endswith(".py") or environ.get("PYTHONPYCACHEPREFIX"):
        return False
    source = Path(origin)
    pyc = source.parent / "__pycache__" / Path(importlib.util.cache_from_source(origin)).name
    if pyc.exists():
        return False
    return bool(environ.get("PYTHONDONTWRITEBYTECODE")) or not os.access(source.parent, os.W_OK)


def cache_bytecode(
    environ: MutableMapping[str, str] = os.environ,
    origin: str | None = None,
    cache: Path | None = None,
) -> str | None:
    """Turn the bytecode cache on in `environ` (the processes it is passed to) when `origin`
    (default: torch's `__init__.py`) has none; return what was done, or None."""
    if not uncached(environ, origin or _package_origin()):
        return None
    cache = cache or default_cache()
    cache.mkdir(parents=True, exist_ok=True)
    environ["PYTHONPYCACHEPREFIX"] = str(cache)
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return (
        f"{PACKAGE} has no compiled bytecode and none may be written beside it, so every process "
        f"would compile its imports again (seconds per process): caching bytecode in {cache} "
        "(PYTHONPYCACHEPREFIX)"
    )


def describe() -> str:
    """Where this process's imports find their bytecode (recorded with every run's host)."""
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
    changed: dict[str, str] = dict(os.environ)
    if note := cache_bytecode(changed):
        print(f"echo {shlex.quote(note)} >&2")
        print(f"export PYTHONPYCACHEPREFIX={shlex.quote(changed['PYTHONPYCACHEPREFIX'])}")
        print("unset PYTHONDONTWRITEBYTECODE")
