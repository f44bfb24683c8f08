#!/usr/bin/env bash
# The GPU bundle's Open MPI, relocated, as on the GPU machine (whose image has no Open MPI and no
# /etc/openmpi): makes a bundle of BUILD_DIR, unpacks it into a temp folder and sets it up with
# scripts/gpu_bundle_env.sh (what gpu_check.sh runs). Where it can (root, unshare), it hides this
# machine's Open MPI and PMIx (/etc/openmpi, their plugin folders and help texts) in a mount
# namespace, so only the bundle's can serve. Then, on the CPU:
#   - mpirun -np 2 `fusiontrain bandwidth` and a 4-step 2-rank training of gpt_tiny, and a 2-step
#     training without mpirun (MPI's singleton start), all as gpu_check.sh sets things up;
#   - mpirun -np 2 `fusiontrain bandwidth` again with OMPI_MCA_mca_base_param_files=/dev/null:
#     the exported settings alone, no settings file at all.
# Each must exit 0 and print nothing that looks like an Open MPI or PMIx warning. Last, the ranks
# list their settings (mpi_show_mca_params): BUNDLE_MCA_PARAMS's must come from the environment,
# and no settings file of /etc/openmpi may be read.
# Usage: bash tests/gpu_bundle_relocated_mpirun.sh BUILD_DIR   (exit 77: skipped, no CUDA path)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD=${1:?usage: gpu_bundle_relocated_mpirun.sh BUILD_DIR}
# shellcheck source=scripts/gpu_bundle_env.sh
source scripts/gpu_bundle_env.sh
# What Open MPI and PMIx print when something is off: warnings, component load errors, the
# boxes of their help texts, a help file not found.
WARNING_PATTERN='WARNING|[Ww]arning|A high-performance Open MPI point-to-point messaging module|mca_base_component_repository_open|PMIX ERROR|PMIx was unable|Sorry!|----------'

# The runs, in the namespace: run_all DIR.
run_all() {
  local dir=$1 failures=0 hidden
  for hidden in /etc/openmpi /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 \
      /usr/share/openmpi; do
    if [ -d "$hidden" ] && [ -n "${HIDE:-}" ]; then
      mount -t tmpfs none "$hidden" || { echo "FAIL: cannot hide $hidden"; return 1; }
      echo "hidden: $hidden"
    fi
  done
  bundle_env_setup "$dir/unpacked" || return 1
  local ft=$dir/unpacked/bin/fusiontrain
  # run NAME COMMAND...: one run, its whole output shown; fails on an exit status or a warning.
  run() {
    local name=$1 rc
    shift
    echo "=== $name: ${*#"$dir"/}"
    "$@" > "$dir/$name.out" 2>&1
    rc=$?
    cat "$dir/$name.out"
    if [ "$rc" != 0 ]; then
      echo "FAIL: $name exited $rc"; failures=$((failures + 1))
    elif grep -Eq "$WARNING_PATTERN" "$dir/$name.out"; then
      echo "FAIL: $name printed what looks like a warning:"
      grep -E "$WARNING_PATTERN" "$dir/$name.out" | sed 's/^/    /'
      failures=$((failures + 1))
    fi
  }
  run bandwidth_np2 "$BUNDLE_MPIRUN" --oversubscribe -np 2 "$ft" bandwidth --max-bytes 1048576
  run train_np2 "$BUNDLE_MPIRUN" --oversubscribe -np 2 "$ft" train --config configs/gpt_tiny.yaml \
    --set train.steps=4 --set train.eval_every=4 --set train.run_dir="$dir/run_np2"
  run train_singleton "$BUNDLE_RUN" "$ft" train --config configs/gpt_tiny.yaml \
    --set train.steps=2 --set train.eval_every=2 --set train.run_dir="$dir/run_singleton"
  OMPI_MCA_mca_base_param_files=/dev/null run bandwidth_np2_environment_only \
    "$BUNDLE_MPIRUN" --oversubscribe -np 2 "$ft" bandwidth --max-bytes 1048576
  # The ranks' view of the settings: each from the environment, and no settings file of Debian's.
  "$BUNDLE_MPIRUN" --oversubscribe -np 2 --mca mpi_show_mca_params all "$ft" bandwidth \
    --max-bytes 4096 > "$dir/settings.out" 2>&1
  local setting name
  for setting in "${BUNDLE_MCA_PARAMS[@]}"; do
    name=${setting%%=*}
    name=${name#OMPI_MCA_}
    case $name in pml | btl | btl_vader_single_copy_mechanism | osc | hwloc_base_binding_policy) ;; *) continue ;; esac
    grep -qF "] $name=${setting#*=} (environment)" "$dir/settings.out" ||
      { echo "FAIL: the ranks do not have $name=${setting#*=} from the environment"; failures=$((failures + 1)); }
  done
  echo "=== settings files the ranks read: $(grep -m1 '] mca_base_param_files=' "$dir/settings.out")"
  grep '] mca_base_param_files=' "$dir/settings.out" | grep -Eq '[=,]/etc/openmpi/' &&
    { echo "FAIL: the ranks read /etc/openmpi"; failures=$((failures + 1)); }
  grep -q "2 ranks" "$dir/bandwidth_np2.out" || { echo "FAIL: bandwidth did not run 2 ranks"; failures=$((failures + 1)); }
  grep -q "^done: 4 steps" "$dir/train_np2.out" || { echo "FAIL: training did not finish"; failures=$((failures + 1)); }
  return "$failures"
}
if [ "${1:-}" = --in-namespace ]; then  # the second half, re-run by the first under unshare
  run_all "$2"
  exit
fi

if [ ! -x "$BUILD/tests/cuda_kernels_test" ] || [[ $(ldd "$BUILD/fusiontrain") != *libcudart* ]]; then
  echo "skipped: $BUILD has no CUDA path (no tests/cuda_kernels_test linking libcudart), so no bundle"
  exit 77
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
GPU_BUNDLE_ALLOW_NATIVE=1 GPU_BUNDLE_XZ_LEVEL=0 GPU_BUNDLE_MAX_MIB=1000 \
  GPU_BUNDLE_OUT="$T/bundle.tar.xz" bash scripts/gpu_bundle.sh "$BUILD" > "$T/bundle.log" 2>&1 ||
  { cat "$T/bundle.log"; echo "FAIL: gpu_bundle.sh failed"; exit 1; }
bundle_unpack "$T/bundle.tar.xz" "$T/unpacked" || { echo "FAIL: cannot unpack"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
if [ "$(id -u)" = 0 ] && unshare -m true 2> /dev/null; then
  HIDE=1 unshare -m bash "$0" --in-namespace "$T"
else
  echo "note: cannot hide this machine's Open MPI (needs root and unshare); running beside it"
  run_all "$T"
fi
rc=$?
[ "$rc" = 0 ] && echo "gpu_bundle_relocated_mpirun: the relocated Open MPI runs, without a warning"
exit "$rc"
