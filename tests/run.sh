#!/usr/bin/env bash
# The test command: what the README's "Test" section shows and what CI runs (.ci/run), on a
# machine with Python 3.11+ and the system packages the README lists (the tests that need one
# that is missing — Debian's Fashion-MNIST, Slurm, Java, Chromium, a GPU — skip with the reason).
#   bash tests/run.sh [PYTEST_ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -r envs/requirements-test.txt
pytest "$@"
