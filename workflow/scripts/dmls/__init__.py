"""The pipeline's package, in layers by where the code runs.

- `config/`: the run spec and the config schema. Snakemake imports it while it parses the
  workflow, so it imports neither torch nor matplotlib.
- `supervisor/`: one job of the `train` rule: can this host run the spec, which cores and GPUs
  it reserves, which launcher commands start it (locally or through Slurm), and the run's
  metrics file. It never imports torch (tests/test_layers.py checks).
- `training/`: inside the ranks the launchers start: the trainer, the parallel strategies, the
  step, precision, optimizers, checkpoints, models, fault drills and the run's result.
- `data/`: datasets prepared once into a cached form, and the loaders that feed the ranks.
- `special/`: the studies that are not training runs of the engine, one module each.
- `report/`: the runs table, per-study tables, figures and the HTML report.
- `files.py`: atomic JSON, CSV and PNG writes, used by every layer.
- `joblog.py`: the log of a Snakemake job, opened the same way by every `script:` entry point.
"""
