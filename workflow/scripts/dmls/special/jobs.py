"""The special studies' jobs, for the rules made from them (rules/special_studies.smk): each
study's `JOB`, declared in its folder's `__init__.py`. Read while Snakemake parses the workflow,
so it imports only those declarations (no report, no torch: tests/test_layers.py)."""

from __future__ import annotations

from importlib import import_module

from dmls.study_spec import StudyJob

# The studies, one folder each under dmls/special/, in the order the report shows them.
NAMES = (
    "profiler",
    "fused_conv",
    "lenet_memory",
    "spare_failure",
    "float32_bytes",
    "graphs",
    "collectives",
    "sharding",
    "spark_lazy",
    "serialization",
)

JOBS: dict[str, StudyJob] = {name: import_module(f"dmls.special.{name}").JOB for name in NAMES}
