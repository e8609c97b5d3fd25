"""Entry point of the special-study rules (Snakemake `script:`): B4, C, D1–D3.

Snakemake puts this folder on sys.path and defines `snakemake` before running the file.
"""

from dmls.special.runner import main_from_snakemake

main_from_snakemake(snakemake)  # noqa: F821
