"""One `train` job around its ranks: host checks, reservations, launch commands, Slurm, the
run's metrics file. Importing this package must not import torch (tests/test_layers.py)."""
