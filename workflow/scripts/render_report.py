"""Entry point of the `render_report` rule (Snakemake `script:`): the one-file HTML report.

Snakemake puts this folder on sys.path and defines `snakemake` before running the file.
"""

from pathlib import Path

from dmls.files import atomic_write
from dmls.report.html import render

smk = snakemake  # noqa: F821
page = render(
    template_dir=Path(smk.input.template).parent,
    texts_path=Path(smk.input.texts),
    section_paths=[Path(p) for p in smk.input.sections],
    special_paths=[Path(p) for p in smk.input.specials],
    runs_csv=Path(smk.input.runs),
    metrics_paths=[Path(p) for p in smk.input.metrics],
    manifest_paths=[Path(p) for p in smk.input.manifests],
    config=smk.params.config,
    workflow_dir=Path(smk.params.workflow_dir),
)
atomic_write(Path(smk.output.html), lambda f: f.write(page.encode()))
with open(smk.log[0], "w") as log:
    print(f"{smk.output.html}: {len(page) / 2**20:.1f} MiB", file=log)
