#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs on a lent GPU machine into gpu_bundle/bundle.tar.xz
# (git-ignored). That machine's image has CUDA 13, cuDNN, NCCL, CMake and PyTorch, but none of
# this project's Debian libraries (oneDNN, yaml-cpp, Open MPI, GoogleTest) and no Fashion-MNIST,
# and it cannot fetch anything, so the project cannot be configured there. The bundle holds the
# CUDA build made here (fusiontrain and the gpu-labelled tests, sm_90), the shared libraries they
# load apart from the C runtime and CUDA's own (the image brings those), Open MPI's runtime (for
# mpirun there) and the datasets (Fashion-MNIST and the GPT corpus).
# gpu_check.sh uses it instead of building when it finds it; pass carry: ["gpu_bundle"] to the
# device tool's run. Must stay under the tool's 64 MiB (the working tree travels too).
# Usage: bash scripts/gpu_bundle.sh [BUILD_DIR]   (BUILD_DIR: an FT_CUDA=ON build, default build-cuda)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${1:-build-cuda}
DATA=${FT_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[ -x "$BUILD/fusiontrain" ] || { echo "gpu_bundle: no $BUILD/fusiontrain; build it first" >&2; exit 1; }
grep -q "FT_CUDA:STRING=ON\|FT_HAVE_CUDA" "$BUILD/CMakeCache.txt" ||
  { echo "gpu_bundle: $BUILD is not a CUDA build (configure with -DFT_CUDA=ON)" >&2; exit 1; }

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin/tests" "$STAGE/lib" "$STAGE/data/fashion-mnist"
binaries=("$BUILD/fusiontrain" "$BUILD"/tests/cuda_*_test "$BUILD/tests/mpi_nccl_test")
cp "$BUILD/fusiontrain" "$STAGE/bin/"
for binary in "${binaries[@]:1}"; do cp "$binary" "$STAGE/bin/tests/"; done

# Every library the binaries load, but the C runtime and the compiler's (the image's are newer,
# and CUDA's libraries need those) and CUDA's (the image's match its driver).
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libcudnn|libnccl)'
for binary in "${binaries[@]}"; do ldd "$binary"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
  sort -u | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    cp -L "$path" "$STAGE/lib/$name"
  done
cp "$DATA"/*.gz "$STAGE/data/fashion-mnist/"
cp data/moby_dick.txt "$STAGE/data/"  # the GPT corpus is git-ignored, so the tree lacks it there

# Open MPI's runtime, for mpirun there: its launcher and daemon, plugins and help texts, relocated
# with OPAL_PREFIX; PMIx, whose plugins it finds by their absolute path (gpu_check.sh links it).
OMPI=$STAGE/ompi/usr
mkdir -p "$OMPI/bin" "$OMPI/lib/x86_64-linux-gnu/openmpi" "$OMPI/share"
cp /usr/bin/orterun /usr/bin/orted "$OMPI/bin/" && ln -s orterun "$OMPI/bin/mpirun"
cp -a /usr/lib/x86_64-linux-gnu/openmpi/lib "$OMPI/lib/x86_64-linux-gnu/openmpi/"
cp -a /usr/lib/x86_64-linux-gnu/pmix2 "$OMPI/lib/x86_64-linux-gnu/"
cp -a /usr/share/openmpi "$OMPI/share/"
for library in libpmix.so.2 libmunge.so.2; do
  cp -L "/usr/lib/x86_64-linux-gnu/$library" "$STAGE/lib/" 2>/dev/null ||
    cp -L "/lib/x86_64-linux-gnu/$library" "$STAGE/lib/"
done

{
  echo "source_dir=$ROOT"    # FT_SOURCE_DIR and FT_BINARY baked into the tests point here
  echo "build_dir=$BUILD"
  echo "commit=$(git rev-parse HEAD)$(git diff --quiet HEAD || echo -dirty)"
  echo "sources=$(bash scripts/source_hash.sh)"
  echo "made=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$STAGE/MANIFEST"

mkdir -p gpu_bundle
tar -C "$STAGE" -cf - . | xz -T0 -6 > gpu_bundle/bundle.tar.xz
size=$(stat -c %s gpu_bundle/bundle.tar.xz)
echo "gpu_bundle: gpu_bundle/bundle.tar.xz, $((size >> 20)) MiB: $(ls "$STAGE/bin/tests" | wc -l) tests," \
  "$(ls "$STAGE/lib" | wc -l) libraries, commit $(sed -n 's/^commit=//p' "$STAGE/MANIFEST")"
[ "$size" -lt $((56 << 20)) ] || { echo "gpu_bundle: over 56 MiB, too big to carry" >&2; exit 1; }
