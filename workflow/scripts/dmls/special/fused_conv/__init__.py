"""C. CNNs with cuDNN, the FusedConvReLU kernel, cuDNN disabled, and on the CPU.

Its job, for the rule made from it (dmls/study_spec.py, StudyJob); `measure.py` measures it and
`spec.py` declares its answer and section."""

from dmls.study_spec import StudyJob

JOB = StudyJob(
    outputs={
        "results": "results.csv",
        "repeats": "repeats.csv",
        "accuracy": "accuracy.csv",
        "figure": "times.png",
    },
    threads="timed",
    gpus=1,
    timed=True,
    long=True,
    data="config",
    extension=True,
)
