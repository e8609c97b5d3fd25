"""D2. Failure probability without and with a spare: closed forms vs Monte Carlo.

Its job, for the rule made from it (dmls/study_spec.py, StudyJob); `measure.py` measures it and
`spec.py` declares its answer and section."""

from dmls.study_spec import StudyJob

JOB = StudyJob(
    outputs={"vectors": "vectors.csv", "curve": "curve.csv", "figure": "failure_vs_n.png"},
)
