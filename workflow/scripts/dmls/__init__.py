"""The pipeline's package, in layers by where the code runs; imports point down the floors
tests/test_layers.py draws (config and shared helpers at the bottom, then the data and the
record, training and the report side by side, the supervisor, the special studies on top).

- `config/`: the run spec and the config schema. Snakemake imports it while it parses the
  workflow, so it imports neither torch nor matplotlib.
- `supervisor/`: one job of the `train` rule: can this host run the spec, which cores and GPUs
  it reserves, which launcher commands start it (locally or through Slurm), and the run's
  metrics file. It never imports torch (tests/test_layers.py checks).
- `training/`: inside the ranks the launchers start: the trainer, the parallel strategies, the
  step, precision, optimizers, checkpoints, models, fault drills and the run's result.
- `data/`: datasets prepared once into a cached form, and the loaders that feed the ranks.
- `special/`: the studies that are not training runs of the engine: each measured by its own
  module (`x.py`) and declared beside it (`x_spec.py`: the facts its answer is filled from and
  what its section shows), registered once in `special/catalog.py`.
- `report/`: the runs table, per-study tables, figures and the HTML report.
- `record.py`: the run record, metrics.json: built (the rank's seeds, the supervisor's
  envelope), its seeds combined, checked against `metrics.schema.json` and read, in one place.
- `summary.py`: a special study's record, summary.json, the same way (`summary.schema.json`).
- `study_spec.py`: what a special study's declaration holds (`StudySpec`), below the report and
  the special studies, so that the report reads declarations without importing a study.
- `protocol.py`: the ranks' side of what passes between a supervisor and the ranks it starts
  (`as_rank`, error reports, the result file, the fault drill's parser), below both.
- `files.py`: atomic JSON, CSV and PNG writes, used by every layer.
- `joblog.py`: the log of a Snakemake job, opened the same way by every `script:` entry point.
"""
