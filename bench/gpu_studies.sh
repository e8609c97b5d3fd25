#!/usr/bin/env bash
# What CI can't run, in one go on a GPU host: the FusedConvReLU CUDA tests, then studies C
# (fused conv), D1 (LeNet-5 memory) and B4 (profiler) through Snakemake, CUDA parts included,
# then a short table. Needs python3 with torch and nvcc; no internet:
#   bash bench/gpu_studies.sh [OUT_DIR]        (default: $OUT, else results/gpu)
# Snakemake comes from .whl/ when python3 lacks it (wheels for that python), Fashion-MNIST from
# the IDX files in .gpudata/. OUT_DIR receives: gpu.txt, test_kernel_cuda.log, snakemake.log,
# tables.txt and gpu_studies.tar.gz (results/studies/{fused_conv,lenet_memory,profiler} + logs).
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-${OUT:-results/gpu}}")
results=/tmp/dmls-gpu-results
mkdir -p "$out" "$results"
# One build of the extension, shared by the tests and the study.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/dmls-torch-extensions}
# Whatever happens below, keep what was produced.
trap 'tar czf "$out/gpu_studies.tar.gz" -C "$results" studies logs 2>/dev/null' EXIT

. bench/gpu_host.sh && gpu_host_setup "$out" || exit 1

start=$SECONDS
python3 -m pytest tests/test_kernel_cuda.py -v -rs -p no:cacheprovider 2>&1 |
  tee "$out/test_kernel_cuda.log"
tests=${PIPESTATUS[0]}
echo "kernel tests: exit $tests in $((SECONDS - start)) s"

start=$SECONDS
cat >/tmp/dmls-gpu.yaml <<YAML
results_dir: $results
data:
  fashion_mnist: {debian_dir: .gpudata, download: false}
YAML
python3 -m snakemake "$results"/studies/{fused_conv,lenet_memory,profiler}/summary.json \
  --cores all --configfile /tmp/dmls-gpu.yaml >"$out/snakemake.log" 2>&1
studies=$?
tail -n 5 "$out/snakemake.log"
echo "studies: exit $studies in $((SECONDS - start)) s"

python3 bench/study_tables.py "$results" | tee "$out/tables.txt"
exit $((tests || studies))
