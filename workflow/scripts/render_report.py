"""Entry point of the `render_report` rule (Snakemake `script:`): the one-file HTML report.

Snakemake puts this folder on sys.path and defines `snakemake` before running the file.
"""

from dmls.joblog import job_log
from dmls.report.page import main_from_snakemake

with job_log(snakemake.log[0]) as log:  # noqa: F821
    main_from_snakemake(snakemake, log)  # noqa: F821
