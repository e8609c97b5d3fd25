import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))

from dmls.config.spec import RunSpec, deep_merge, load_schema, resolve_runs  # noqa: E402
from dmls.stats import JobNoise  # noqa: E402

# Jobs that never differ beyond their seeds, as if every two jobs of identical settings had run
# at one speed: the tests of a comparison's seed interval and words pass it to Study, where the
# variation between jobs is not what they test (tests/test_job_noise.py tests that part).
JOBS_ALIKE = {"cuda": JobNoise(1.0, 2), "cpu": JobNoise(1.0, 2)}


def alike(key, settings, metrics):
    """A Study of `metrics` whose jobs differ by their seeds alone (`JOBS_ALIKE`)."""
    from dmls.report.study import Study

    return Study.from_metrics(key, settings, metrics, job_noise=JOBS_ALIKE)


SCHEMA = ROOT / "config" / "schemas" / "config.schema.yaml"


def validated(config: dict) -> dict:
    """`config` validated and completed with the schema's defaults, as the Snakefile does."""
    from snakemake.utils import validate

    validate(config, str(SCHEMA))
    return config


def make_spec(study: str = "t", run: str = "r", **overrides) -> RunSpec:
    """A resolved run spec: the schema's defaults under `overrides` (nested dicts merge)."""
    config = validated({"defaults": deep_merge({}, overrides), "studies": {}})
    config["studies"] = {"parallelism": {"runs": {run: {}}}}
    spec = resolve_runs(config, load_schema())[f"parallelism/{run}"]
    return RunSpec.from_dict(spec.to_dict() | {"study": study})


@pytest.fixture(autouse=True, scope="session")
def _private_slot_locks(tmp_path_factory):
    """Runs started by the tests reserve cores and GPUs in a lock folder of their own, never in
    the one the user's real workflows share (dmls/supervisor/slots.py)."""
    from dmls.supervisor import slots

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(slots.SLOTS_DIR_ENV, str(tmp_path_factory.mktemp("slots")))
        yield


@pytest.fixture(scope="session")
def tabular_dir(tmp_path_factory) -> Path:
    """A prepared synthetic tabular set (B's shape), shared by the engine tests."""
    from dmls.data import datasets

    out = tmp_path_factory.mktemp("data")
    datasets.prepare(
        "tabular", {"dir": None, "synthetic": {"n_train": 256, "n_test": 100, "seed": 0}}, out
    )
    return out


# What the browser tests drive (tools/screenshot_report.py), and where a user gets it.
BROWSER = {
    "chromium": "apt-get install chromium",
    "chromedriver": "apt-get install chromium-driver",
}


def needs_browser() -> None:
    """Skip a browser test, naming the package to install, where the browser, its driver or
    selenium is missing (before: selenium's NoSuchDriverException, naming none)."""
    import shutil

    lacking = [f"{tool} ({how})" for tool, how in BROWSER.items() if shutil.which(tool) is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        lacking.append("selenium (pip install -r envs/requirements-test.txt)")
    if lacking:
        pytest.skip(f"a real browser is needed: {', '.join(lacking)} not found")
