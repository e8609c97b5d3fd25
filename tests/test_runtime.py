"""Config `runtime`: how a job's Python processes run, set where asked for and nowhere else."""

import gc
import os

import pytest

from conftest import make_spec
from dmls.supervisor import supervise

SPEC = dict(dataset="tabular", model={"name": "mlp", "hidden": 8}, device="cpu", epochs=1,
            batch_size=128, num_workers=0)  # fmt: skip


def run(tmp_path, tabular_dir, runtime):
    with open(tmp_path / "train.log", "w") as log:
        return supervise.run(
            make_spec(**SPEC), run_dir=tmp_path / "run", data_dir=tabular_dir, log=log,
            threads=1, checkpoint_path=tmp_path / "c.pt", runtime=runtime,
        )  # fmt: skip


@pytest.mark.parametrize("gc_mode", ["freeze", "default"])
def test_the_bytecode_cache_reaches_the_jobs_processes_only_and_the_gc_mode_the_ranks(
    tmp_path, tabular_dir, monkeypatch, gc_mode
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    before = dict(os.environ)
    metrics = run(tmp_path, tabular_dir, {"bytecode_cache": True, "gc": gc_mode})
    assert metrics["status"] == "ok", metrics["reason"]
    (env,) = metrics["launch"]["env"]
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "xdg" / "dmls" / "pycache")
    assert env["PYTHONDONTWRITEBYTECODE"] == ""
    (argv,) = metrics["launch"]["commands"]
    assert argv[argv.index("--gc") + 1] == gc_mode
    assert metrics["launch"]["runtime"] == {"bytecode_cache": True, "gc": gc_mode}
    assert dict(os.environ) == before  # the user's own environment, untouched
    assert gc.isenabled()


def test_without_the_setting_no_variable_is_added(tmp_path, tabular_dir):
    metrics = run(tmp_path, tabular_dir, supervise.DEFAULT_RUNTIME)
    (env,) = metrics["launch"]["env"]
    assert "PYTHONPYCACHEPREFIX" not in env and "PYTHONDONTWRITEBYTECODE" not in env
