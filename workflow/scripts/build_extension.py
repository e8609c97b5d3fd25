"""Entry point of the `build_fused_conv_relu` rule (Snakemake `script:`): compile study C's
CUDA extension ahead of the study.

Snakemake puts this folder on sys.path and defines `snakemake` before running the file.
"""

from dmls.joblog import job_log
from dmls.special.fused_conv.build import build_from_snakemake

with job_log(snakemake.log[0]) as log:  # noqa: F821
    build_from_snakemake(snakemake, log)  # noqa: F821
