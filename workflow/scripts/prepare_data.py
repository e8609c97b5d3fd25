"""Entry point of the `prepare_data` rule (Snakemake `script:`): prepare one dataset into
results/data/<name>.{npz,json}.

Snakemake puts this folder on sys.path and defines `snakemake` before running the file.
"""

from dmls.data.datasets import main_from_snakemake
from dmls.joblog import job_log

with job_log(snakemake.log[0]) as log:  # noqa: F821
    main_from_snakemake(snakemake, log)  # noqa: F821
