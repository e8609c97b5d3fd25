# Sourced by the bench/*.sh scripts that run on a lent GPU machine (python3 with torch, no
# internet): `gpu_host_setup OUT_DIR` makes Snakemake importable (from the wheels in .whl/,
# built for that python, when python3 lacks it) and writes the host's GPUs, torch and cores to
# OUT_DIR/gpu.txt, with a bytecode cache where the host has none. Returns non-zero when the
# wheels don't install.
gpu_host_setup() {
  export PYTHONUNBUFFERED=1
  if ! python3 -c "import snakemake" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/dmls-site .whl/*.whl || return 1
    export PYTHONPATH=/tmp/dmls-site${PYTHONPATH:+:$PYTHONPATH}
  fi
  python3 -c "import scipy.stats" || { echo "python3 lacks scipy: carry its wheel in .whl/"; return 1; }
  # The lent hosts set PYTHONDONTWRITEBYTECODE=1 and their torch has no .pyc files: without a
  # cache every process compiles torch's modules again (config runtime.bytecode_cache does the same
  # for a DAG run by hand; docs/performance.md says what it costs).
  eval "$(python3 workflow/scripts/dmls/bytecode.py)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$1/gpu.txt"
  python3 -c "import os, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
      'cores', len(os.sched_getaffinity(0)))" | tee -a "$1/gpu.txt"
}

# `pack_results RESULTS_DIR TARBALL`: the results folder without checkpoints, model files,
# prepared arrays and the report's pictures: what `compare` reads, and what the report renders
# from again (the data's .json descriptions and each section's section.json stay).
pack_results() {
  local name
  name=$(basename "$1")
  tar czf "$2" --exclude='*.pt' --exclude="$name/data/*.npz" --exclude='*.png' \
    --exclude=report.html -C "$(dirname "$1")" "$name"
}
