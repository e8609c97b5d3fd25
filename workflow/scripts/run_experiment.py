"""Entry point of the `train` rule (Snakemake `script:`): supervise one run.

Snakemake puts this folder on sys.path and defines `snakemake` before running the file.
"""

from dmls.joblog import job_log
from dmls.supervisor.supervise import main_from_snakemake

with job_log(snakemake.log[0]) as log:  # noqa: F821
    main_from_snakemake(snakemake, log)  # noqa: F821
