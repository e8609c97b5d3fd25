"""The conda env of the rules and the pip requirements pin the same versions; CI runs the
test command the README shows."""

import re

import yaml

from conftest import ROOT


def pins(lines) -> dict[str, str]:
    out = {}
    for line in lines:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)==([^\s#]+)\s*(#.*)?", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_conda_env_pins_equal_requirements():
    requirements = pins((ROOT / "envs" / "requirements.txt").read_text().splitlines())
    env = yaml.safe_load((ROOT / "envs" / "pipeline.yaml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pins(pip_section) == requirements
    assert {"torch", "torchvision", "snakemake"} <= requirements.keys()  # each pinned (==)


def test_the_spark_env_is_the_pipelines_plus_java_and_the_pyspark_the_study_names():
    """D6's rule has its own env: the pipeline's pins, a JRE and pyspark, pinned as the study's
    skip message and the test requirements pin it."""
    from dmls.special.spark_lazy.measure import PYSPARK_VERSION

    requirements = pins((ROOT / "envs" / "requirements.txt").read_text().splitlines())
    env = yaml.safe_load((ROOT / "envs" / "spark.yaml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pins(pip_section) == requirements | {"pyspark": PYSPARK_VERSION}
    assert "openjdk=17" in env["dependencies"]
    tests = pins((ROOT / "envs" / "requirements-test.txt").read_text().splitlines())
    assert tests["pyspark"] == PYSPARK_VERSION


def test_ci_runs_the_one_test_command_the_readme_shows():
    """CI runs tests/run.sh, the file the README's test section shows, rather than a line
    read out of README prose (a README edit can't break CI, nor CI drift from the README)."""
    assert "bash tests/run.sh" in (ROOT / "README.md").read_text()
    assert "bash tests/run.sh" in (ROOT / ".ci" / "run").read_text()
    script = (ROOT / "tests" / "run.sh").read_text()
    assert "pip install -r envs/requirements-test.txt" in script and "\npytest" in script
