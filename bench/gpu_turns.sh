#!/usr/bin/env bash
# The timed studies that take turns (B4, D5) measured again on a GPU host, with the example's
# config, and the engine's CUDA tests that check the memory invariant (what a step adds plus
# what its GPU held before it, at most the allocated peak, in every seed). Needs python3 with
# torch; no internet:
#   bash bench/gpu_turns.sh [OUT_DIR]        (default: $OUT, else results/gpu)
# OUT_DIR receives gpu.txt, test_engine_cuda.log, snakemake.log and turns.tar.gz
# (results/studies/{profiler,graphs} and their logs, to merge into docs/example-report).
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-${OUT:-results/gpu}}")
results=/tmp/dmls-turns/example
mkdir -p "$out" "$results"
trap 'tar czf "$out/turns.tar.gz" -C "$results" studies logs 2>/dev/null' EXIT

. bench/gpu_host.sh && gpu_host_setup "$out" || exit 1

start=$SECONDS
python3 -m pytest tests/test_engine_cuda.py -v -rs -p no:cacheprovider \
  -k "captured_step_learns or mixed_precision" 2>&1 | tee "$out/test_engine_cuda.log" | tail -n 12
tests=${PIPESTATUS[0]}
echo "engine CUDA tests: exit $tests in $((SECONDS - start)) s"

start=$SECONDS
python3 -m snakemake "$results"/studies/{profiler,graphs}/summary.json --cores all \
  --configfile docs/example-report/config.yaml --config results_dir="$results" \
  >"$out/snakemake.log" 2>&1
studies=$?
tail -n 5 "$out/snakemake.log"
echo "studies: exit $studies in $((SECONDS - start)) s"
exit $((tests || studies))
