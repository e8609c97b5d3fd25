"""Entry point of the `render_report` rule (Snakemake `script:`): the one-file HTML report.

Snakemake puts this folder on sys.path and defines `snakemake` before running the file. The
special studies' declarations are handed to the report from here, on top of both: the report
never imports a special study.
"""

from dmls.joblog import job_log
from dmls.report.page import main_from_snakemake
from dmls.special.catalog import STUDIES

with job_log(snakemake.log[0]) as log:  # noqa: F821
    main_from_snakemake(snakemake, log, STUDIES)  # noqa: F821
