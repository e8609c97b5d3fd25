"""D6. Question 4's PySpark program, line by line: jobs, stages, tasks, rows per line.

Its job, for the rule made from it (dmls/study_spec.py, StudyJob); `measure.py` measures it and
`spec.py` declares its answer and section."""

from dmls.study_spec import StudyJob

JOB = StudyJob(
    outputs={"lines": "lines.csv", "plans": "plans.txt"},
    threads=2,  # Spark's local[2]
    environment="spark",
)
