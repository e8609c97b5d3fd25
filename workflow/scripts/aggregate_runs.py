"""Entry point of the `aggregate_runs` rule (Snakemake `script:`): write results/runs.csv.

Snakemake puts this folder on sys.path and defines `snakemake` before running the file.
"""

from dmls.joblog import job_log
from dmls.report.aggregate import main_from_snakemake

with job_log(snakemake.log[0]) as log:  # noqa: F821
    main_from_snakemake(snakemake, log)  # noqa: F821
