"""Entry point of the `aggregate_runs` rule (Snakemake `script:`): write results/runs.csv.

Snakemake puts this folder on sys.path and defines `snakemake` before running the file.
"""

from pathlib import Path

from dmls.files import atomic_write
from dmls.report.aggregate import collect

smk = snakemake  # noqa: F821
frame = collect([Path(p) for p in smk.input.metrics])
atomic_write(Path(smk.output.table), lambda f: frame.to_csv(f, index=False))
with open(smk.log[0], "w") as log:
    print(f"{len(frame)} runs: {frame['status'].value_counts().to_dict()}", file=log)
