"""D7. Serialization's pitfalls, run: representation, references, depth, trust.

Its job, for the rule made from it (dmls/study_spec.py, StudyJob); `measure.py` measures it and
`spec.py` declares its answer and section."""

from dmls.study_spec import StudyJob

JOB = StudyJob(
    outputs={
        "representation": "representation.csv",
        "references": "references.csv",
        "depth": "depth.csv",
        "trust": "trust.csv",
    },
)
