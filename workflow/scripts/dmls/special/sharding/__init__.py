"""D4. DDP, ZeRO-1, ZeRO-2 and ZeRO-3 through the engine: memory per rank, step time.

Its job, for the rule made from it (dmls/study_spec.py, StudyJob); `measure.py` measures it and
`spec.py` declares its answer and section."""

from dmls.study_spec import StudyJob

JOB = StudyJob(
    outputs={"table": "sharding.csv", "figure": "memory.png"},
    threads="processes",
    gpus="processes",
    timed=True,
    long=True,
    data="config",
    # After the sweep, whose table predicts the communication (and which would otherwise time
    # its collectives beside this study's training).
    after=("collectives",),
)
