#!/usr/bin/env bash
# GPU check for the CUDA path, for a machine with an NVIDIA GPU (H200, sm_90 by default):
# builds with FT_CUDA=ON into build-gpu, runs the CUDA tests through ctest (output shown), runs the
# NCCL test as one MPI rank (ctest's 2- and 3-rank runs skip on a single GPU), and writes a JSON
# summary to $OUT/gpu_check.json (./gpu_check.json when OUT is unset).
# Exit status: 0 only when the build passed, every step exited 0 and no CUDA test was skipped
# (a skip on a GPU machine means the GPU was not usable, which is a failure here).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT_DIR=${OUT:-$ROOT}
mkdir -p "$OUT_DIR"
BUILD=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
SUMMARY="$OUT_DIR/gpu_check.json"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

echo "== gpu_check: $(nvidia-smi -L 2>&1 | head -n 4)"
gpu_name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)

step() {  # step NAME COMMAND...: runs, tees output to $OUT_DIR/NAME.log, stores the exit code
  local name=$1; shift
  echo "== gpu_check: $name: $*"
  "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  local rc=${PIPESTATUS[0]}
  eval "rc_$name=$rc"
  echo "== gpu_check: $name exited $rc"
}

step configure cmake -S . -B "$BUILD" -DFT_CUDA=ON ${CMAKE_CUDA_ARCHITECTURES:+-DCMAKE_CUDA_ARCHITECTURES=$CMAKE_CUDA_ARCHITECTURES}
rc_build=1 rc_ctest=1 rc_nccl_np1=1
if [ "$rc_configure" -eq 0 ]; then
  step build cmake --build "$BUILD" --target cuda_test mpi_nccl_test -j "$JOBS"
fi
if [ "$rc_build" -eq 0 ]; then
  # gtest_discover_tests names each case Suite.Test; these suites all live in cuda_test.
  step ctest ctest --test-dir "$BUILD" -V --timeout 300 \
    -R '^(CudaCheck|Cudnn|GeluKernel|CublasLtGemm|Cuda)\.|^mpi_nccl_test_np'
  step cuda_test "$BUILD/tests/cuda_test" --gtest_output="json:$OUT_DIR/cuda_test.json"
  step nccl_np1 mpirun --oversubscribe -np 1 "$BUILD/tests/mpi_nccl_test" \
    --gtest_output="json:$OUT_DIR/mpi_nccl_test.json"
fi

python3 - "$SUMMARY" "$OUT_DIR" "$gpu_name" "$rc_configure" "$rc_build" "$rc_ctest" \
    "${rc_cuda_test:-1}" "$rc_nccl_np1" <<'PY'
import json, os, sys
summary_path, out_dir, gpu = sys.argv[1], sys.argv[2], sys.argv[3]
codes = dict(zip(["configure", "build", "ctest", "cuda_test", "nccl_np1"], map(int, sys.argv[4:])))

def gtest_counts(name):
    path = os.path.join(out_dir, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        report = json.load(f)
    cases = [case for suite in report.get("testsuites", []) for case in suite.get("testsuite", [])]
    skipped = [c["classname"] + "." + c["name"] for c in cases if c.get("result") == "SKIPPED"]
    failed = [c["classname"] + "." + c["name"] for c in cases if c.get("failures")]
    return {"tests": len(cases), "failed": failed, "skipped": skipped}

results = {name: gtest_counts(name) for name in ["cuda_test", "mpi_nccl_test"]}
ok = all(code == 0 for code in codes.values()) and all(
    r is not None and r["tests"] > 0 and not r["failed"] and not r["skipped"]
    for r in results.values())
summary = {"ok": ok, "gpu": gpu, "exit_codes": codes, "gtest": results,
           "logs": sorted(f for f in os.listdir(out_dir) if f.endswith(".log"))}
with open(summary_path, "w") as f:
    json.dump(summary, f, indent=2)
print(json.dumps(summary, indent=2))
sys.exit(0 if ok else 1)
PY
