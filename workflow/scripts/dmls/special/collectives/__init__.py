"""A5 explained: all-reduce, all-gather, reduce-scatter against message size.

Its job, for the rule made from it (dmls/study_spec.py, StudyJob); `measure.py` measures it and
`spec.py` declares its answer and section."""

from dmls.study_spec import StudyJob

JOB = StudyJob(
    outputs={"table": "collectives.csv", "figure": "bandwidth.png"},
    threads="processes",
    gpus="processes",
    timed=True,
    long=True,
    slurm_nodes=True,
    a_runs_model=True,
)
