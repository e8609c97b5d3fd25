#!/usr/bin/env bash
# The whole default DAG on one GPU host, timed (issue #6's target: <= 10 minutes on 2 GPUs).
# CIFAR-10 can't be fetched on the lent GPU machines, so the A studies train on a SYNTHETIC
# CIFAR-shaped set of the same size (50,000 + 10,000 images) and study C on Fashion-MNIST from
# .gpudata/; every other setting is config/config.yaml's. No internet needed:
#   bash bench/dag_speed.sh [OUT_DIR] [SECONDS] [TARGET...]
#     (default: $OUT, else results/dag; 3000 s; every job. A TARGET is a path under the
#     results folder, e.g. runs/parallelism/ddp_2gpu/metrics.json: only the jobs it needs)
#   ISOLATION=devices bash bench/dag_speed.sh ...     (jobs side by side; default: host)
#   EXTRA_CONFIG=file.yaml bash bench/dag_speed.sh ... (config keys over the ones below)
#   RESULTS=results/dag-host bash bench/dag_speed.sh ... (another results folder; default
#     results/dag-gpu, kept on a warm machine so that a second call resumes the DAG)
# Snakemake comes from .whl/ when python3 lacks it. OUT_DIR receives snakemake.log, the table
# of every job's time (dag_table.txt, from bench/dag_table.py), runs.csv, report.html and the
# results folder as bench/gpu_host.sh's pack_results packs it (results.tar.gz).
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-${OUT:-results/dag}}")
limit=${2:-3000}
results=${RESULTS:-results/dag-gpu}
targets=("${@:3}")
targets=("${targets[@]/#/$results/}")
mkdir -p "$out"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/dmls-torch-extensions}
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
. bench/gpu_host.sh && gpu_host_setup "$out" || exit 1
cat >/tmp/dmls-dag.yaml <<YAML
results_dir: $results
isolation: ${ISOLATION:-host}
defaults: {dataset: synthetic_cifar}
data:
  synthetic_cifar: {n_train: 50000, n_test: 10000, seed: 0}
  fashion_mnist: {debian_dir: .gpudata, download: false}
YAML
start=$SECONDS
# Targets first: --configfile takes every word after it.
# (--config last: the results folder is this script's, whatever EXTRA_CONFIG says.)
# (--keep-going: a job that fails, a report's included, stops no other job of the timed DAG)
timeout "$limit" python3 -m snakemake "${targets[@]}" --cores all --resources gpu="$gpus" --keep-going \
  --configfile /tmp/dmls-dag.yaml ${EXTRA_CONFIG:+"$EXTRA_CONFIG"} \
  --config results_dir="$results" >"$out/snakemake.log" 2>&1
status=$?
wall=$((SECONDS - start))
tail -n 3 "$out/snakemake.log"
echo "DAG: exit $status in $wall s on $gpus GPU(s), isolation ${ISOLATION:-host}" |
  tee "$out/dag_wall.txt"
python3 bench/dag_table.py "$results" --wall "$wall" | tee "$out/dag_table.txt"
cp "$results/runs.csv" "$results/report/report.html" "$out/" 2>/dev/null
pack_results "$results" "$out/results.tar.gz"
exit "$status"
