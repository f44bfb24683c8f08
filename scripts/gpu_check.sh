#!/usr/bin/env bash
# GPU check of the CUDA path, one prepared run for a lent machine (one H200, 16 cores; sm_90 by
# default): builds with FT_CUDA=ON into build-gpu, runs every test with the ctest label `gpu`
# (each CUDA kernel against its CPU kernel, training on cuda against cpu, the cuda export) and the
# NCCL test as one rank, then `train` of gpt_tiny on cuda (eager and fusion.cuda_graph), then
# `bandwidth` on NCCL with 1 rank and MPI-staged with 2 ranks, then
# `bench` of gpt_tiny, gpt_small and resnet8 on cuda (unfused, each strategy, all, cuda_graph:
# the whole step replayed as one CUDA graph, captured after two eager steps). Everything
# is written under $OUT (./gpu_check_out when OUT is unset): logs, gtest and bench JSON, and
# gpu_check.json, the summary. Sized to end within 8 minutes; GPU_CHECK_QUICK=1 skips the bench.
# MFU is against PEAK_TFLOPS (default 67: an H200 SXM's dense FP32 without tensor cores, which is
# what train.tf32: false runs).
# Exit status: 0 only when every step exited 0 and no GPU test was skipped (a skip on a GPU
# machine means the GPU was not usable, which is a failure here).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT_DIR=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$OUT_DIR"
BUILD=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
FT="$BUILD/fusiontrain"
STEPS=()

echo "== gpu_check: $(nvidia-smi -L 2>&1 | head -n 4)"
gpu_name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)

step() {  # step NAME COMMAND...: runs with a 300 s cap, tees to $OUT_DIR/NAME.log, keeps the rc
  local name=$1; shift
  echo "== gpu_check: $name: $*"
  timeout 300 "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  local rc=${PIPESTATUS[0]}
  STEPS+=("$name=$rc")
  echo "== gpu_check: $name exited $rc"
  return "$rc"
}

if step configure cmake -S . -B "$BUILD" -DFT_CUDA=ON \
      ${CMAKE_CUDA_ARCHITECTURES:+-DCMAKE_CUDA_ARCHITECTURES=$CMAKE_CUDA_ARCHITECTURES} &&
   step build cmake --build "$BUILD" -j "$JOBS"; then
  for binary in "$BUILD"/tests/cuda_*_test; do
    name=$(basename "$binary")
    step "$name" "$binary" --gtest_output="json:$OUT_DIR/$name.json"
  done
  step nccl_np1 mpirun --oversubscribe -np 1 "$BUILD/tests/mpi_nccl_test" \
    --gtest_output="json:$OUT_DIR/mpi_nccl_test.json"
  step bandwidth_nccl_np1 mpirun --oversubscribe -np 1 "$FT" bandwidth --backend nccl \
    --max-bytes 268435456 --json "$OUT_DIR/bandwidth_nccl_np1.json"
  step bandwidth_mpi_staged_np2 mpirun --oversubscribe -np 2 "$FT" bandwidth --device cuda \
    --max-bytes 67108864 --json "$OUT_DIR/bandwidth_mpi_staged_np2.json"
  # The train job end to end on the GPU: logging, eval and checkpoints, eager and as CUDA-graph
  # replays; runs live outside $OUT (checkpoints are large), their metrics are copied in.
  for graph in false true; do
    run_dir=$(mktemp -d)/gpt_tiny_cuda_graph_$graph
    step "train_gpt_tiny_cuda_graph_$graph" "$FT" train --config configs/gpt_tiny.yaml \
      --set train.device=cuda --set train.steps=60 --set train.eval_every=30 \
      --set fusion.cuda_graph=$graph --set train.run_dir="$run_dir"
    cp "$run_dir/metrics.jsonl" "$OUT_DIR/train_gpt_tiny_cuda_graph_$graph.metrics.jsonl" 2>/dev/null
  done
  if [ "${GPU_CHECK_QUICK:-0}" != 1 ]; then
    for config in gpt_tiny gpt_small resnet8; do
      step "bench_$config" "$FT" bench --config "configs/$config.yaml" \
        --set train.device=cuda --variants unfused,horizontal,vertical,all,cuda_graph \
        --steps 20 --warmup 3 --peak-tflops "${PEAK_TFLOPS:-67}" \
        --json "$OUT_DIR/bench_$config.json"
    done
  fi
fi

python3 - "$OUT_DIR" "$gpu_name" "${STEPS[@]}" <<'PY'
import glob, json, os, sys
out_dir, gpu = sys.argv[1], sys.argv[2]
codes = dict(item.split("=", 1) for item in sys.argv[3:])
codes = {name: int(rc) for name, rc in codes.items()}

def gtest_counts(path):
    with open(path) as f:
        report = json.load(f)
    cases = [case for suite in report.get("testsuites", []) for case in suite.get("testsuite", [])]
    skipped = [c["classname"] + "." + c["name"] for c in cases if c.get("result") == "SKIPPED"]
    failed = [c["classname"] + "." + c["name"] for c in cases if c.get("failures")]
    return {"tests": len(cases), "failed": failed, "skipped": skipped}

gtest = {os.path.basename(p)[:-5]: gtest_counts(p)
         for p in sorted(glob.glob(os.path.join(out_dir, "*_test.json")))}
ok = bool(codes) and all(rc == 0 for rc in codes.values()) and "build" in codes and bool(gtest) \
    and all(r["tests"] > 0 and not r["failed"] and not r["skipped"] for r in gtest.values())
summary = {"ok": ok, "gpu": gpu, "exit_codes": codes, "gtest": gtest,
           "files": sorted(os.listdir(out_dir))}
with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
    json.dump(summary, f, indent=2)
print(json.dumps(summary, indent=2))
sys.exit(0 if ok else 1)
PY
