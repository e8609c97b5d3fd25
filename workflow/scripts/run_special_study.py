"""Entry point of the special-study rules (Snakemake `script:`): B4, C, D1–D3.

Snakemake puts this folder on sys.path and defines `snakemake` before running the file.
"""

from dmls.joblog import job_log
from dmls.special.runner import main_from_snakemake

with job_log(snakemake.log[0]) as log:  # noqa: F821
    main_from_snakemake(snakemake, log)  # noqa: F821
