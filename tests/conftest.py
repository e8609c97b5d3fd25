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


# The special studies run here on the CPU, whose answers tests/test_special_answers*.py
# read (D1, D2 once per module; B4, C per test). dmls.special.runner is imported where a
# study runs, as it loads torch.
def ran(tmp_path_factory, name: str, cfg: dict) -> tuple[dict, Path]:
    """A special study run on the CPU into a folder of its own: (its summary.json, the folder)."""
    from dmls.special import runner
    from dmls.summary import read as read_summary

    folder = tmp_path_factory.mktemp(name)
    runner.run_study(name, cfg, folder)
    return read_summary(folder / "summary.json"), folder


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    cfg = {"title": "D1", "batch_size": 8, "activation": "tanh", "optimizers": ["adamw"],
           "precisions": ["fp32"], "recompute": ["none", "full"], "steps": 2,
           "seed": 0}  # fmt: skip
    return ran(tmp_path_factory, "lenet_memory", cfg)


@pytest.fixture(scope="module")
def spare(tmp_path_factory):
    cfg = {"title": "D2", "p_vectors": {"pair": [0.1, 0.2], "three": [0.05, 0.1, 0.3]},
           "curve_p": [0.1], "curve_n": [1, 2, 4], "trials": 200_000, "confidence": 0.99,
           "seed": 3}  # fmt: skip
    return ran(tmp_path_factory, "spare_failure", cfg)


@pytest.fixture
def b4(tmp_path, tabular_dir):
    """The profiler on the CPU, 3 repeats: (summary, folder)."""
    from dmls.special import runner

    cfg = {"title": "B4", "batches": 4, "batch_size": 8, "warmup_batches": 1, "repeats": 3,
           "activations": ["relu", "gelu"], "hidden": 32, "seed": 0}  # fmt: skip
    folder = tmp_path / "b4"
    return runner.run_study("profiler", cfg, folder, data_dir=tabular_dir), folder


@pytest.fixture
def c(tmp_path, monkeypatch):
    """The fused-kernel study with its GPU modes as CPU baselines, so that the comparison runs
    on a host without CUDA: (summary, folder)."""
    from dmls.data import datasets
    from dmls.special import runner
    from dmls.special.fused_conv import measure as fused_conv

    data = tmp_path / "images"
    datasets.prepare("synthetic_cifar", {"n_train": 64, "n_test": 32, "seed": 0}, data)
    for name in ("cudnn", "fused"):
        mode = fused_conv.Mode("cpu", fused=False, cudnn=True, title=name)
        monkeypatch.setitem(fused_conv.MODES, name, mode)
    cfg = {"title": "C", "dataset": "synthetic_cifar", "depths": [2, 4], "channels": 4,
           "fc_hidden": 8, "modes": ["cudnn", "fused", "cpu"], "epochs": 1, "batch_size": 16,
           "lr": 0.001, "warmup_steps": 1, "timed_steps": 3, "train_samples": 64,
           "test_samples": 32, "tf32": False, "seed": 0, "repeats": 3, "accuracy_seeds": 2,
           "accuracy_modes": ["cudnn", "fused"]}  # fmt: skip
    folder = tmp_path / "c"
    return runner.run_study("fused_conv", cfg, folder, data_dir=data), folder
