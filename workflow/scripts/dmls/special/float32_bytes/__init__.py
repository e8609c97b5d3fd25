"""D3. IEEE-754 bits and byte orders of a float32, computed on this host.

Its job, for the rule made from it (dmls/study_spec.py, StudyJob); `measure.py` measures it and
`spec.py` declares its answer and section."""

from dmls.study_spec import StudyJob

JOB = StudyJob(
    outputs={"table": "bytes.csv", "figure": "bits.png"},
)
