"""The code inside each training rank: trainer, parallel strategies, steps, precision,
optimizers, checkpoints, models, fault drills and the run's result."""
