#!/usr/bin/env bash
# Communication-fusion matrix: per-step allreduce calls, communication and exposed communication
# for both models with bucketing off/on and overlap off/on, with and without an emulated slow
# link. Allreduce durations inside a step include waiting for the slower rank; for the cost of
# the collectives alone see bench/grad_sync_bench.cpp.
# Usage: scripts/comm_matrix.sh [ranks=2] [steps=30]   (prints a Markdown table; JSON in runs/comm_matrix/)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-2}
steps=${2:-30}
out=runs/comm_matrix
bin=${BUILD_DIR:-build}/fusiontrain
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() {  # config bucketing overlap emulate(none|slow) -> json path
  local config=$1 bucketing=$2 overlap=$3 link=$4
  local name="$(basename "$config" .yaml)_b${bucketing}_o${overlap}_${link}"
  local extra=()
  [ "$link" = slow ] && extra=(--set comm.emulate.latency_us=20 --set comm.emulate.bandwidth_gbps=10)
  case $config in *resnet*) extra+=(--set data.test_limit=64) ;; esac  # a resnet-only key
  mpirun --oversubscribe -np "$ranks" "$bin" train --config "$config" \
    --set train.steps="$steps" --set train.eval_every=0 --set train.log_every=1000 \
    --set train.threads=1 --set train.eval_batches=1 \
    --set comm.bucketing="$bucketing" --set comm.overlap="$overlap" \
    --set train.run_dir="$out/$name" --set train.checkpoint_dir="$out/$name" --set train.overwrite=true \
    "${extra[@]}" --json "$out/$name.jsonl" > "$out/$name.log" 2>&1
  echo "$out/$name.jsonl"
}
echo "| model | link | bucketing | overlap | allreduce/step | buckets | comm ms/step | exposed comm ms/step | step ms |"
echo "|---|---|---|---|---|---|---|---|---|"
for config in configs/gpt_tiny.yaml configs/resnet8.yaml; do
  for link in none slow; do
    for bucketing in false true; do
      for overlap in false true; do
        json=$(run "$config" "$bucketing" "$overlap" "$link")
        python3 - "$json" "$config" "$link" "$bucketing" "$overlap" <<'PY'
import json, sys
path, config, link, bucketing, overlap = sys.argv[1:]
rows = [json.loads(line) for line in open(path)]
summary = rows[-1]
comm = summary["comm_per_step"]
label = "emulated link 10 Gb/s, 20 us" if link == "slow" else "loopback (shared memory)"
print(f"| {config.split('/')[-1][:-5]} | {label} | {bucketing} | {overlap} | {comm['allreduce_calls']:.0f} | "
      f"{comm['buckets'] if bucketing == 'true' else '-'} | {comm['comm_ms']:.2f} | {comm['exposed_comm_ms']:.2f} | {summary['ms_per_step']:.1f} |")
PY
      done
    done
  done
done

