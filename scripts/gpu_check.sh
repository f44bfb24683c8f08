#!/usr/bin/env bash
# GPU check of the CUDA path, one prepared run for a lent machine (one H200, 16 cores; sm_90 by
# default): builds with FT_CUDA=ON into build-gpu, runs every test with the ctest label `gpu`
# (each CUDA kernel against its CPU kernel, training on cuda against cpu, the cuda export) and the
# NCCL test as one rank, then `train` of gpt_tiny on cuda (eager and fusion.cuda_graph), then
# `bandwidth` on NCCL with 1 rank and MPI-staged with 2 ranks, then
# `bench` of gpt_tiny, gpt_small and resnet8 on cuda (unfused, each strategy, all, cuda_graph:
# the whole step replayed as one CUDA graph, captured after two eager steps). Everything
# comes back under $OUT (./gpu_check_out when OUT is unset): gpu_check.json, the summary, and
# gpu_check_logs.tar.gz with every log, gtest and bench JSON. Sized to end within 8 minutes; GPU_CHECK_QUICK=1 skips the bench.
# MFU is against PEAK_TFLOPS (default 67: an H200 SXM's dense FP32 without tensor cores, which is
# what train.tf32: false runs).
# Exit status: 0 only when every step exited 0 and no GPU test was skipped (a skip on a GPU
# machine means the GPU was not usable, which is a failure here).
#
# The lent machine's image cannot configure this project (no oneDNN, yaml-cpp, Open MPI or
# GoogleTest, and nothing can be fetched there). So when gpu_bundle/bundle.tar.xz is there
# (scripts/gpu_bundle.sh, made here from an FT_CUDA=ON build), the script runs its binaries and
# libraries and its Open MPI instead of configuring and building; if no Open MPI mpirun works
# after all, the steps that need it (NCCL test, bandwidth) are recorded as not run. Before the
# device call:
#   cmake -S . -B build-cuda -DFT_CUDA=ON && cmake --build build-cuda -j2 &&
#   bash scripts/gpu_bundle.sh
# then run `bash scripts/gpu_check.sh` with carry: ["gpu_bundle"].
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
RESULT_DIR=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$RESULT_DIR"
# The device tool brings back at most 8 files from $OUT: the logs and JSON are written to a work
# folder and come back as one archive beside the summary.
OUT_DIR=$(mktemp -d)
BUILD=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
STEPS=()
BUNDLE=${GPU_BUNDLE:-gpu_bundle/bundle.tar.xz}

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
skip_step() {  # skip_step NAME REASON: recorded as not run (rc -1), with the reason in its log
  echo "== gpu_check: $1 skipped: $2" | tee "$OUT_DIR/$1.log"
  STEPS+=("$1=-1")
}

# The image's CUDA libraries: the toolkit's and those of its Python packages (cuDNN, NCCL).
cuda_library_path() {
  local dirs=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/nvidia/lib64)
  while read -r dir; do dirs+=("$dir"); done < <(python3 - <<'PY' 2>/dev/null
import os
try:
    import nvidia
    for base in nvidia.__path__:
        for name in sorted(os.listdir(base)):
            lib = os.path.join(base, name, "lib")
            if os.path.isdir(lib):
                print(lib)
except ImportError:
    pass
PY
)
  # Anything still missing is searched for where images keep libraries.
  local library found
  for library in libcudart.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
    found=0
    for dir in "${dirs[@]}"; do [ -e "$dir/$library" ] && found=1; done
    [ "$found" = 1 ] && continue
    dir=$(find /usr /opt /lib -name "$library" 2>/dev/null | head -n 1)
    [ -n "$dir" ] && dirs+=("$(dirname "$dir")")
  done
  local path=""
  for dir in "${dirs[@]}"; do [ -d "$dir" ] && path="$path${path:+:}$dir"; done
  echo "$path"
}

use_bundle() {  # unpacks the bundle where its tests expect their sources and binaries
  local unpacked=/tmp/ft_gpu_bundle source_dir build_dir
  rm -rf "$unpacked" && mkdir -p "$unpacked" && tar -C "$unpacked" -xJf "$BUNDLE" || return 1
  cat "$unpacked/MANIFEST"
  # A bundle of other sources would test old binaries: remake it (scripts/gpu_bundle.sh).
  local sources
  sources=$(bash scripts/source_hash.sh)
  if [ "$(sed -n 's/^sources=//p' "$unpacked/MANIFEST")" != "$sources" ]; then
    echo "bundle: built from other sources than this tree ($sources); run scripts/gpu_bundle.sh"
    return 1
  fi
  source_dir=$(sed -n 's/^source_dir=//p' "$unpacked/MANIFEST")
  build_dir=$(sed -n 's/^build_dir=//p' "$unpacked/MANIFEST")
  # The tests name their configs and the binary by the path they were built at.
  if [ "$source_dir" != "$ROOT" ] && [ ! -e "$source_dir" ]; then
    mkdir -p "$(dirname "$source_dir")" && ln -s "$ROOT" "$source_dir"
  fi
  BUILD=$build_dir
  mkdir -p "$BUILD/tests"
  cp "$unpacked/bin/fusiontrain" "$BUILD/" && cp "$unpacked"/bin/tests/* "$BUILD/tests/"
  [ -e "$ROOT/data/moby_dick.txt" ] || cp "$unpacked/data/moby_dick.txt" "$ROOT/data/"
  if [ ! -e /usr/share/datasets/fashion-mnist ]; then
    mkdir -p /usr/share/datasets && ln -s "$unpacked/data/fashion-mnist" /usr/share/datasets/
  fi
  export LD_LIBRARY_PATH="$unpacked/lib:$(cuda_library_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The bundle's Open MPI, the one its libmpi belongs to (another mpirun could not start it):
  # relocated by OPAL_PREFIX; PMIx finds its plugins by the path it was built with; plm isolated
  # starts local ranks without ssh.
  export OPAL_PREFIX="$unpacked/ompi/usr" PATH="$unpacked/ompi/usr/bin:$PATH"
  export OMPI_MCA_plm=isolated
  if [ ! -e /usr/lib/x86_64-linux-gnu/pmix2 ]; then
    mkdir -p /usr/lib/x86_64-linux-gnu &&
      ln -s "$OPAL_PREFIX/lib/x86_64-linux-gnu/pmix2" /usr/lib/x86_64-linux-gnu/pmix2
  fi
  echo "mpirun: the bundle's, $(mpirun --version 2>&1 | head -n 1)"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ! ldd "$BUILD/fusiontrain" "$BUILD"/tests/* | grep "not found"
}

if [ -f "$BUNDLE" ]; then
  echo "== gpu_check: bundle: $BUNDLE"
  use_bundle > "$OUT_DIR/bundle.log" 2>&1  # not in a pipe: it sets BUILD and LD_LIBRARY_PATH
  built=$?
  cat "$OUT_DIR/bundle.log"
  STEPS+=("bundle=$built")
  echo "== gpu_check: bundle exited $built"
else
  step configure cmake -S . -B "$BUILD" -DFT_CUDA=ON \
      ${CMAKE_CUDA_ARCHITECTURES:+-DCMAKE_CUDA_ARCHITECTURES=$CMAKE_CUDA_ARCHITECTURES} &&
    step build cmake --build "$BUILD" -j "$JOBS"
  built=$?
fi
FT="$BUILD/fusiontrain"
have_mpirun=0  # ours links Open MPI's libmpi; another MPI's launcher cannot start it
mpirun --version 2>&1 | grep -q "Open MPI" && have_mpirun=1
mpi_step() {  # mpi_step NAME COMMAND...: step, or skip_step where the machine has no mpirun
  if [ "$have_mpirun" = 1 ]; then step "$@"; else skip_step "$1" "no Open MPI mpirun on this machine"; fi
}

if [ "$built" = 0 ]; then
  for binary in "$BUILD"/tests/cuda_*_test; do
    name=$(basename "$binary")
    step "$name" "$binary" --gtest_output="json:$OUT_DIR/$name.json"
  done
  # NcclSharedGpu needs more ranks than GPUs, so one rank always skips it: left out, because a
  # skip fails this check.
  mpi_step nccl_np1 mpirun --oversubscribe -np 1 "$BUILD/tests/mpi_nccl_test" \
    --gtest_filter=-NcclSharedGpu.* --gtest_output="json:$OUT_DIR/mpi_nccl_test.json"
  mpi_step bandwidth_nccl_np1 mpirun --oversubscribe -np 1 "$FT" bandwidth --backend nccl \
    --max-bytes 268435456 --json "$OUT_DIR/bandwidth_nccl_np1.json"
  mpi_step bandwidth_mpi_staged_np2 mpirun --oversubscribe -np 2 "$FT" bandwidth --device cuda \
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
not_run = sorted(name for name, rc in codes.items() if rc == -1)  # skip_step: no mpirun
ran = {name: rc for name, rc in codes.items() if rc != -1}
ok = bool(ran) and all(rc == 0 for rc in ran.values()) and ("build" in ran or "bundle" in ran) \
    and bool(gtest) \
    and all(r["tests"] > 0 and not r["failed"] and not r["skipped"] for r in gtest.values())
summary = {"ok": ok, "gpu": gpu, "exit_codes": ran, "not_run": not_run, "gtest": gtest,
           "files": sorted(os.listdir(out_dir))}
with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
    json.dump(summary, f, indent=2)
print(json.dumps(summary, indent=2))
sys.exit(0 if ok else 1)
PY
rc=$?
cp "$OUT_DIR/gpu_check.json" "$RESULT_DIR/"
tar -C "$OUT_DIR" -czf "$RESULT_DIR/gpu_check_logs.tar.gz" .
echo "== gpu_check: $RESULT_DIR/gpu_check.json and gpu_check_logs.tar.gz (every log and JSON)"
exit "$rc"
