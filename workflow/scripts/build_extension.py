"""Entry point of the `build_fused_conv_relu` rule (Snakemake `script:`): compile study C's
CUDA extension ahead of the study.

Snakemake puts this folder on sys.path and defines `snakemake` before running the file.
"""

from dmls.special.runner import build_from_snakemake

build_from_snakemake(snakemake)  # noqa: F821
