"""Entry point of the `train` rule (Snakemake `script:`): supervise one run.

Snakemake puts this folder on sys.path and defines `snakemake` before running the file. The
supervisor opens the rule's log itself, once it holds the run's lock.
"""

from dmls.supervisor.supervise import main_from_snakemake

main_from_snakemake(snakemake)  # noqa: F821
