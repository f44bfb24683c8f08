#!/usr/bin/env bash
# Library loading of the GPU bundle, checked here without a GPU: makes a bundle of BUILD_DIR
# (scripts/gpu_bundle.sh, into a temp folder), unpacks it as gpu_check.sh does but without xz
# (Python's tarfile), and runs ldd on every binary and plugin with only the bundle's libraries and
# the CUDA folders on the library path (scripts/gpu_bundle_env.sh, as on the GPU machine). Fails
# on a library not found, and on one that resolves outside the bundle although the GPU image
# does not bring it (found here in /usr/lib, it would be missing there). Then runs
# `fusiontrain --version` and mpirun --version through the bundle's wrappers, and checks that the
# check fails once a library is taken out of the bundle.
# Usage: bash tests/gpu_bundle_library_loading.sh BUILD_DIR   (exit 77: skipped, no CUDA path)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD=${1:?usage: gpu_bundle_library_loading.sh BUILD_DIR}
if [ ! -x "$BUILD/tests/cuda_kernels_test" ] || [[ $(ldd "$BUILD/fusiontrain") != *libcudart* ]]; then
  echo "skipped: $BUILD has no CUDA path (no tests/cuda_kernels_test linking libcudart), so no bundle"
  exit 77
fi
# shellcheck source=scripts/gpu_bundle_env.sh
source scripts/gpu_bundle_env.sh
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# The ctest build is -march=native, hence the tests' escape hatch; xz -0 keeps it quick.
start=$SECONDS
GPU_BUNDLE_ALLOW_NATIVE=1 GPU_BUNDLE_XZ_LEVEL=0 GPU_BUNDLE_MAX_MIB=1000 \
  GPU_BUNDLE_OUT="$T/bundle.tar.xz" bash scripts/gpu_bundle.sh "$BUILD" || fail "gpu_bundle.sh failed"
echo "bundle made in $((SECONDS - start)) s"

# No xz on the image: an xz that fails makes tar fail, and bundle_unpack falls back on Python.
mkdir "$T/no_xz"
printf '#!/bin/sh\necho "xz: not on this image" >&2\nexit 1\n' > "$T/no_xz/xz"
chmod +x "$T/no_xz/xz"
start=$SECONDS
PATH="$T/no_xz:$PATH" bundle_unpack "$T/bundle.tar.xz" "$T/unpacked" > "$T/unpack.log" 2>&1 ||
  { cat "$T/unpack.log"; fail "bundle_unpack failed"; }
grep -q "unpacking with Python's tarfile" "$T/unpack.log" || fail "Python's tarfile was not used"
echo "unpacked with Python's tarfile in $((SECONDS - start)) s"
if [ ! -L "$T/unpacked/ompi/usr/bin/mpirun" ] || [ ! -x "$T/unpacked/bin/fusiontrain" ]; then
  fail "links or modes lost in unpacking"
fi

bundle_env_setup "$T/unpacked" || fail "bundle_env_setup failed"
echo "library path: $BUNDLE_LIBRARY_PATH"
mapfile -t files < <(bundle_files "$T/unpacked")
for expected in bin/fusiontrain bin/tests/cuda_kernels_test bin/tests/mpi_nccl_test \
    ompi/usr/bin/orterun ompi/usr/bin/orted \
    ompi/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/mca_pml_ob1.so \
    ompi/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/pmix_mca_prm_default.so; do
  [[ " ${files[*]} " == *" $T/unpacked/$expected "* ]] || fail "the bundle lacks $expected"
done
echo "ldd of ${#files[@]} binaries and plugins"
bundle_ldd_check strict "${files[@]}" || fail "libraries missing from the bundle (above)"
grep -qx "pml = ob1" "$T/unpacked/ompi/usr/etc/openmpi-mca-params.conf" ||
  fail "no Open MPI settings file in the bundle"

# Loaded for real, through the wrappers gpu_check.sh uses.
"$BUNDLE_RUN" "$T/unpacked/bin/fusiontrain" --version || fail "fusiontrain --version failed"
"$BUNDLE_MPIRUN" --version | head -n 1 || fail "mpirun --version failed"

# The check can fail: without one of the bundle's libraries, ldd finds the system's copy, which
# the GPU image lacks.
victim=$(find "$T/unpacked/lib" -name 'libyaml-cpp.so*' | head -n 1)
[ -n "$victim" ] || victim=$(find "$T/unpacked/lib" -type f | head -n 1)
rm "$victim"
if bundle_ldd_check strict "$T/unpacked/bin/fusiontrain" > "$T/broken.log"; then
  fail "the check passed without $(basename "$victim")"
fi
echo "without $(basename "$victim") the check fails, as it should: $(head -n 1 "$T/broken.log")"
echo "gpu_bundle_library_loading: every library of the bundle loads"
