#!/usr/bin/env bash
# The example report's GPU sittings (docs/example-report/), in one command on a lent GPU host:
#   bash bench/example_report.sh OUT_DIR [SECONDS]      (default: $OUT; 1500 s for the DAG)
# Long: start it detached on a warm machine and read OUT_DIR back in later calls:
#   setsid bash bench/example_report.sh /tmp/example >/tmp/example.log 2>&1 &
#   ... later: test -e /tmp/example/DONE && cp /tmp/example.tar.gz "$OUT"
# Everything comes back as one file, OUT_DIR.tar.gz (the device tool returns 8 files at most).
# Three sittings, one after the other, each timed and tabled (bench/dag_speed.sh):
#  1. dag/: the whole DAG with the example's config (docs/example-report/config.yaml over
#     config/config.yaml), jobs side by side (`isolation: devices`), in results/example;
#  2. b_alone/: B1's five runs and B2's four again, one Snakemake call per run, each alone on
#     the host with the cores `isolation: devices` gives it (their records replace the DAG's in
#     results/example, so B1's cause is read from runs that had the host to themselves; the
#     report's timeline draws the sitting on an axis of its own). SKIP_ALONE=1 skips it.
#  3. host/: compare.html's other side: A1's single_gpu and ddp_2gpu and A6's four batch
#     sizes with `isolation: host` (each job alone on the machine), in results/example-host.
#     SKIP_HOST=1 skips it.
# Then OUT_DIR/DONE. D6 (Spark) needs Java, which the lent hosts lack: run it where Java is and
# merge its studies/spark_lazy/ into the same results folder (the example's README says how).
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-${OUT:-results/example-out}}")
limit=${2:-1500}
config=${CONFIG:-docs/example-report/config.yaml}  # (CONFIG: another, to try it quickly)
mkdir -p "$out"
. bench/gpu_host.sh && gpu_host_setup "$out" >/dev/null || exit 1  # (Snakemake, here too)
export ISOLATION=devices EXTRA_CONFIG=$config
start=$SECONDS
RESULTS=results/example bash bench/dag_speed.sh "$out/dag" "$limit"
echo "dag: exit $? after $((SECONDS - start)) s" | tee -a "$out/sittings.txt"
cp /tmp/dmls-dag.yaml "$out/dag-config.yaml"  # (the DAG's own keys: to render it again elsewhere)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)

if [ -z "${SKIP_ALONE:-}" ]; then
  mkdir -p "$out/b_alone"
  alone=$SECONDS
  for run in cluster_torchrun/{n1xp1,n1xp2,n1xp2_passive,n2xp1,n2xp2} \
    cluster_accelerate/{n1xp1,n1xp2,n2xp1,n2xp2}; do
    # --force on the one target: this run again, nothing downstream; /tmp/dmls-dag.yaml is
    # the DAG's own config, written by bench/dag_speed.sh.
    python3 -m snakemake "results/example/runs/$run/metrics.json" --force --cores all \
      --resources gpu="$gpus" --configfile /tmp/dmls-dag.yaml "$config" \
      --config results_dir=results/example >>"$out/b_alone/snakemake.log" 2>&1
    echo "$run: exit $?" | tee -a "$out/b_alone/runs.txt"
  done
  wall=$((SECONDS - alone))
  echo "b_alone: $wall s" | tee -a "$out/sittings.txt"
  python3 bench/dag_table.py results/example --wall "$wall" \
    --studies cluster_torchrun cluster_accelerate | tee "$out/b_alone/dag_table.txt"
  pack_results results/example "$out/dag/results.tar.gz"
fi

if [ -z "${SKIP_HOST:-}" ]; then
  ISOLATION=host RESULTS=results/example-host bash bench/dag_speed.sh "$out/host" 900 \
    runs/parallelism/single_gpu/metrics.json runs/parallelism/ddp_2gpu/metrics.json \
    runs/batch_size/{b16,b32,b64,b128}/metrics.json
  echo "host: exit $?" | tee -a "$out/sittings.txt"
fi
echo "all sittings: $((SECONDS - start)) s" | tee -a "$out/sittings.txt"
rm -f "$out"/*/report.html  # (rendered again where the example is finished)
tar czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
touch "$out/DONE"
