"""B4. torch.profiler over test batches of the B model: time and memory per module.

Its job, for the rule made from it (dmls/study_spec.py, StudyJob); `measure.py` measures it and
`spec.py` declares its answer and section."""

from dmls.study_spec import StudyJob

JOB = StudyJob(
    outputs={
        "modules": "modules.csv",
        "measurements": "measurements.csv",
        "repeats": "repeats.csv",
        "figure": "profile.png",
        "traces": "traces/",
    },
    threads="timed",
    gpus=1,
    timed=True,
    data="tabular",
)
