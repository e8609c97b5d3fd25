#!/usr/bin/env bash
# Issue #6's GPU measurements in one go on a GPU host: the CUDA-graph tests, then
# bench/epoch_speed.py (every comparison; the DDP rows when 2 GPUs are present; Fashion-MNIST
# accuracy of both data paths when its IDX files are in .gpudata/). No internet needed:
#   bash bench/gpu_speed.sh [OUT_DIR]        (default: $OUT, else results/gpu)
# OUT_DIR receives gpu.txt, test_engine_cuda.log, speed.log (the table) and speed.json.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-${OUT:-results/gpu}}")
mkdir -p "$out"
# (Snakemake too: the bench completes its run specs with Snakemake's schema validation.)
. bench/gpu_host.sh && gpu_host_setup "$out" || exit 1

python3 -m pytest tests/test_engine_cuda.py -v -rs -p no:cacheprovider >"$out/test_engine_cuda.log" 2>&1
tests=$?
tail -n 4 "$out/test_engine_cuda.log"

accuracy=()
[ -f .gpudata/train-images-idx3-ubyte.gz ] && accuracy=(--accuracy-data .gpudata)
timeout 500 python3 bench/epoch_speed.py "${accuracy[@]}" --out "$out/speed.json" 2>"$out/speed.err" |
  tee "$out/speed.log"
speed=${PIPESTATUS[0]}
[ "$speed" = 0 ] || tail -n 30 "$out/speed.err"
exit $((tests || speed))
