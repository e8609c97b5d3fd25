"""D1. LeNet-5 parameters and training memory: closed-form estimate vs measured peaks.

Its job, for the rule made from it (dmls/study_spec.py, StudyJob); `measure.py` measures it and
`spec.py` declares its answer and section."""

from dmls.study_spec import StudyJob

JOB = StudyJob(
    outputs={
        "parameters": "parameters.csv",
        "activations": "activations.csv",
        "estimate": "estimate.csv",
        "measured": "measured.csv",
        "figure": "memory.png",
    },
    threads="timed",
    gpus=1,
    timed=True,
)
