"""The conda env of the rules and the pip requirements pin the same versions."""

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
    from dmls.special.spark_lazy import PYSPARK_VERSION

    requirements = pins((ROOT / "envs" / "requirements.txt").read_text().splitlines())
    env = yaml.safe_load((ROOT / "envs" / "spark.yaml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pins(pip_section) == requirements | {"pyspark": PYSPARK_VERSION}
    assert "openjdk=17" in env["dependencies"]
    tests = pins((ROOT / "envs" / "requirements-test.txt").read_text().splitlines())
    assert tests["pyspark"] == PYSPARK_VERSION
