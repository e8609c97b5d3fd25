"""Every special study, registered once: its declaration (`SPEC` of dmls/special/<name>_spec.py,
a `dmls.study_spec.StudySpec`) under its name. The runner looks a study up here to measure it;
the report's entry script (workflow/scripts/render_report.py) hands this to the report, which
imports no special study. Importing this imports no torch (tests/test_layers.py checks)."""

from __future__ import annotations

from dmls.special import (
    collectives_spec,
    float32_bytes_spec,
    fused_conv_spec,
    graphs_spec,
    lenet_memory_spec,
    profiler_spec,
    serialization_spec,
    sharding_spec,
    spare_failure_spec,
    spark_lazy_spec,
)
from dmls.study_spec import registry

STUDIES = registry(
    profiler_spec.SPEC,
    fused_conv_spec.SPEC,
    lenet_memory_spec.SPEC,
    spare_failure_spec.SPEC,
    float32_bytes_spec.SPEC,
    graphs_spec.SPEC,
    collectives_spec.SPEC,
    sharding_spec.SPEC,
    spark_lazy_spec.SPEC,
    serialization_spec.SPEC,
)
