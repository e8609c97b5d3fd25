"""D5. The course CNN eager, compiled and exported: first call, steady step, captures.

Its job, for the rule made from it (dmls/study_spec.py, StudyJob); `measure.py` measures it and
`spec.py` declares its answer and section."""

from dmls.study_spec import StudyJob

JOB = StudyJob(
    outputs={"results": "results.csv", "control_flow": "control_flow.csv", "figure": "graphs.png"},
    threads="timed",
    gpus=1,
    timed=True,
    long=True,
)
