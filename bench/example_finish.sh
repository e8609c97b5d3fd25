#!/usr/bin/env bash
# The example report's last steps, where Java and Chromium are (the development machine), from
# what bench/example_report.sh brought back from the GPU host:
#   bash bench/example_finish.sh GPU_OUT_DIR [DEST]        (DEST: docs/example-report)
#   bash bench/example_finish.sh --committed [DEST]   (DEST's own records, rendered again)
# 1. the DAG's results (dag/results.tar.gz: records, study files, the data's descriptions) into
#    $WORK/example (WORK: results), the isolation-host run's (host/results.tar.gz) into
#    $WORK/example-host;
#    RERUN="a.tar.gz …": studies trained again after the DAG replace its runs (below);
# 2. D6 (Spark), which the lent hosts can't run (no Java), into the same folder: its summary
#    names this host;
# 3. the report rendered again from the records with this commit's code; no run trains here
#    (--allowed-rules: the records are inputs, not outputs to rebuild);
# 4. compare.html (this folder against the isolation-host run), the visible words and A4 pages;
# 5. into DEST: report.html, compare.html, runs.csv, seeds.csv, the DAG's tables and logs, and
#    each results folder without checkpoints, models, prepared arrays or the compiled extension.
# The screenshots and the README stay by hand: they are read before they are written.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${2:-docs/example-report}
config=${CONFIG:-docs/example-report/config.yaml}  # (CONFIG: another, to try it elsewhere)
work=$(realpath -m "${WORK:-results}")
rm -rf "$work/example" "$work/example-host"
mkdir -p "$work"
if [ "$1" = --committed ]; then
  # The committed records (DEST/results/) rendered again with this tree's code: nothing from a
  # GPU host, D6 kept as recorded, DEST's dag-config.yaml the DAG's own keys.
  gpu=
  cp -r "$dest/results/example" "$work/"
  [ -d "$dest/results/example-host" ] && cp -r "$dest/results/example-host" "$work/"
  dag_config=$dest/dag-config.yaml
  again=(aggregate_runs report_study render_report)
else
  gpu=$(realpath "$1")
  tar xzf "$gpu/dag/results.tar.gz" -C "$work"
  [ -e "$gpu/host/results.tar.gz" ] && tar xzf "$gpu/host/results.tar.gz" -C "$work"
  dag_config=$gpu/dag-config.yaml
  again=(spark_lazy aggregate_runs report_study render_report)
fi
# RERUN: results tarballs (bench/gpu_host.sh pack_results) of whole studies trained again after
# the DAG, each on one host: their runs replace the DAG's (records, step timings, host files).
for tarball in ${RERUN:-}; do
  again=$(mktemp -d)
  tar xzf "$tarball" -C "$again"
  for part in runs benchmarks/train hosts; do
    for src in "$again"/*/"$part"/*; do
      rm -rf "$work/example/$part/$(basename "$src")"
      cp -r "$src" "$work/example/$part/"
    done
  done
  rm -rf "$again"
done
# The DAG's own keys (bench/dag_speed.sh's) and the example's, the results where unpacked.
only=(--allowed-rules aggregate_runs report_study render_report spark_lazy)
python3 -m snakemake "$work/example/report/report.html" --cores 2 "${only[@]}" \
  --forcerun "${again[@]}" \
  --configfile "$dag_config" "$config" --config results_dir="$work/example" 2>&1 |
  tail -n 5
if [ -d "$work/example-host" ]; then
  python3 workflow/scripts/compare_folders.py "$work/example" "$work/example-host" \
    -o "$work/example/report/compare.html"
fi
REPORT="$work/example/report/report.html" python3 - <<'PY'
import os
import sys
sys.path.insert(0, "tools")
from screenshot_report import reading
facts = reading(os.environ["REPORT"])
closed = [s for s, ok in facts["opens_on_section"].items() if not ok]
print(f"visible words: {facts['words']:,}; A4 pages: {facts['pdf_pages']}; key tables wider "
      f"than the page: {facts['wide_key_tables'] or 'none'}; links not opening on their "
      f"section: {closed or 'none'}")
PY
mkdir -p "$dest/results"
cp "$work/example/report/report.html" "$work/example/runs.csv" "$work/example/seeds.csv" "$dest/"
[ -e "$work/example/report/compare.html" ] && cp "$work/example/report/compare.html" "$dest/"
if [ -n "$gpu" ]; then
  cp "$gpu/dag-config.yaml" "$dest/dag-config.yaml"
  cp "$gpu/dag/dag_table.txt" "$dest/dag_table.txt"
  [ -e "$gpu/b_alone/dag_table.txt" ] && cp "$gpu/b_alone/dag_table.txt" "$dest/dag_table_b_alone.txt"
  [ -e "$gpu/host/dag_table.txt" ] && cp "$gpu/host/dag_table.txt" "$dest/dag_table_host.txt"
  cp "$gpu/sittings.txt" "$gpu/dag/gpu.txt" "$dest/" 2>/dev/null || true
fi
for folder in example example-host; do
  [ -d "$work/$folder" ] || continue
  rm -rf "${dest:?}/results/$folder"
  mkdir -p "$dest/results/$folder"
  # (the report's section.json files stay: each section's numbers as rendered)
  tar cf - --exclude='*.pt' --exclude='*.npz' --exclude='*.png' --exclude=report.html \
    --exclude=compare.html --exclude=checkpoints --exclude=build --exclude=.workflow.lock \
    --exclude=.sources-read --exclude=.snakemake_timestamp -C "$work" "$folder" |
    tar xf - -C "$dest/results"
done
du -sh "$dest"
