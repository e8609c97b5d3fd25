"""Entry point of the `report_study` rule (Snakemake `script:`): one study's report section.

Snakemake puts this folder on sys.path and defines `snakemake` before running the file.
"""

from pathlib import Path

from dmls.files import read_json
from dmls.report import section
from dmls.report.study import Study

smk = snakemake  # noqa: F821
study = Study.from_metrics(
    smk.wildcards.study, smk.params.settings, [read_json(p) for p in smk.input.metrics]
)
other = None
if smk.params.compare_with and smk.input.compared:
    other = Study.from_metrics(
        smk.params.compare_with,
        smk.params.compare_settings,
        [read_json(p) for p in smk.input.compared],
    )
built = section.build(
    study,
    other,
    out_dir=Path(smk.output.section).parent,
    curves_dir=Path(smk.output.curves),
    figures_dir=Path(smk.output.figures),
)
with open(smk.log[0], "w") as log:
    print(f"{study.key}: {len(built['figures'])} figures, {len(built['curves'])} runs", file=log)
    print("\n".join(built["status"] + built["observations"]), file=log)
