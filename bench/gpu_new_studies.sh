#!/usr/bin/env bash
# The special studies of issue #18 on a GPU host, CUDA parts included: A5 explained (the
# collectives sweep: NCCL, Gloo on CPU and on CUDA tensors), D4 (sharding: DDP, ZeRO-1/2/3
# through the engine; its communication predicted from that sweep), D5 (static vs dynamic
# graphs), their report sections, then bench/graphs_profile.py (where D5's GPU step goes) and
# the engine's GPU tests of the sharded strategies. No internet; D4 trains on a synthetic
# CIFAR-shaped set:
#   bash bench/gpu_new_studies.sh [OUT_DIR] [SECONDS]     (default: $OUT, else results/gpu18; 420)
#   SKIP_PROFILE=1 SKIP_TESTS=1 bash bench/gpu_new_studies.sh ...   (without the profile, tests)
# OUT_DIR receives gpu.txt, snakemake.log, the studies' folders (studies.tar.gz), the report,
# graphs_profile.json and tests.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-${OUT:-results/gpu18}}")
limit=${2:-420}
results=/tmp/dmls-gpu18
mkdir -p "$out" "$results"
trap 'tar czf "$out/studies.tar.gz" -C "$results" studies logs 2>/dev/null' EXIT
. bench/gpu_host.sh && gpu_host_setup "$out" || exit 1
python3 -c "import torch; print('nccl', torch.cuda.nccl.version())" | tee -a "$out/gpu.txt"
cat >/tmp/dmls-gpu18.yaml <<YAML
results_dir: $results
isolation: devices
studies: {}
data:
  synthetic_cifar: {n_train: 2048, n_test: 512, seed: 0}
special_studies:
  profiler: {enabled: false}
  fused_conv: {enabled: false}
  lenet_memory: {enabled: false}
  spare_failure: {enabled: false}
  float32_bytes: {enabled: false}
  sharding: {dataset: synthetic_cifar}
YAML
start=$SECONDS
timeout "$limit" python3 -m snakemake "$results/report/report.html" --cores all \
  --resources gpu="$(nvidia-smi -L | grep -c "^GPU")" --configfile /tmp/dmls-gpu18.yaml \
  --replace-workflow-config \
  >"$out/snakemake.log" 2>&1
studies=$?
tail -n 3 "$out/snakemake.log"
echo "studies: exit $studies in $((SECONDS - start)) s" | tee -a "$out/gpu.txt"
cp "$results/report/report.html" "$out/" 2>/dev/null
if [ -z "${SKIP_PROFILE:-}" ]; then
  python3 bench/graphs_profile.py --out "$out/graphs_profile.json" 2>&1 | tee "$out/graphs_profile.log"
fi
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -q -p no:cacheprovider tests/test_engine_cuda.py -k sharded >"$out/tests.log" 2>&1
  echo "tests: exit $?" | tee -a "$out/tests.log"
fi
exit "$studies"
