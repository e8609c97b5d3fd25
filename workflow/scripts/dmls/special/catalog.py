"""Every special study, registered once: the folder `dmls/special/<name>/` of each of NAMES,
whose `spec.py` declares it (`SPEC`, a `dmls.study_spec.StudySpec`) and whose `measure.py`
measures it. The runner looks a study up here to measure it; the report's entry script
(workflow/scripts/render_report.py) hands it to the report, which imports no special study.
Importing this imports no torch: a study's `measure.py` is imported only when it runs
(tests/test_layers.py checks)."""

from __future__ import annotations

from importlib import import_module

from dmls.special.jobs import NAMES
from dmls.study_spec import StudySpec, registry


def _declared(name: str) -> StudySpec:
    """The SPEC of `dmls/special/<name>/spec.py`, whose `name` must be its folder's."""
    spec: StudySpec = import_module(f"dmls.special.{name}.spec").SPEC
    if spec.name != name:
        raise ValueError(f"dmls/special/{name}/spec.py declares the study {spec.name!r}")
    return spec


STUDIES: dict[str, StudySpec] = registry(*map(_declared, NAMES))
