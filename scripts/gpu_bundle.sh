#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs on a lent GPU machine into gpu_bundle/bundle.tar.xz
# (git-ignored). That machine's image has CUDA 13, cuDNN, NCCL, CMake and PyTorch, but none of
# this project's Debian libraries (oneDNN, yaml-cpp, Open MPI, GoogleTest) and no Fashion-MNIST,
# and it cannot fetch anything, so the project cannot be configured there. The bundle holds the
# CUDA build made here (fusiontrain and the gpu-labelled tests, sm_90), the shared libraries they
# load apart from the C runtime and CUDA's own (the image brings those), Open MPI's runtime (for
# mpirun there, with its settings: scripts/gpu_bundle_env.sh) and the datasets (Fashion-MNIST and
# the GPT corpus).
# gpu_check.sh uses it instead of building when it finds it; pass carry: ["gpu_bundle"] to the
# device tool's run. Must stay under the tool's 64 MiB (the working tree travels too).
#
# The GPU machine has another CPU, so the build must not be -march=native:
#   cmake -S . -B build-cuda -DFT_CUDA=ON -DFT_MARCH=x86-64-v3 && cmake --build build-cuda -j2 && bash scripts/gpu_bundle.sh build-cuda
#
# Usage: bash scripts/gpu_bundle.sh [BUILD_DIR]   (a build with the CUDA path, default build-cuda)
# For the tests only: GPU_BUNDLE_ALLOW_NATIVE=1 accepts a -march=native build (with a warning),
# GPU_BUNDLE_OUT names the archive, GPU_BUNDLE_XZ_LEVEL sets xz's level (default 6) and
# GPU_BUNDLE_MAX_MIB the size limit (default 56).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
# shellcheck source=scripts/gpu_bundle_env.sh
source scripts/gpu_bundle_env.sh
BUILD=${1:-build-cuda}
OUT_FILE=${GPU_BUNDLE_OUT:-gpu_bundle/bundle.tar.xz}
DATA=${FT_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[ -x "$BUILD/fusiontrain" ] || { echo "gpu_bundle: no $BUILD/fusiontrain; build it first" >&2; exit 1; }
BUILD=$(cd "$BUILD" && pwd)
[[ $(ldd "$BUILD/fusiontrain") == *libcudart* ]] ||
  { echo "gpu_bundle: $BUILD is not a CUDA build (configure with -DFT_CUDA=ON)" >&2; exit 1; }

# Binaries compiled for this machine's CPU (-march=native) may stop with SIGILL on the GPU
# machine's, so only a portable level is bundled.
march=$(sed -n 's/^FT_MARCH:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || true)
if [ -z "$march" ] || [ "$march" = native ]; then
  message="$BUILD is built with FT_MARCH=${march:-native (no FT_MARCH entry)}, which may not run on the GPU machine's CPU; configure with -DFT_MARCH=x86-64-v3"
  if [ "${GPU_BUNDLE_ALLOW_NATIVE:-0}" != 1 ]; then
    echo "gpu_bundle: $message" >&2
    exit 1
  fi
  echo "gpu_bundle: warning: $message (accepted: GPU_BUNDLE_ALLOW_NATIVE=1, for tests only)" >&2
fi

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin/tests" "$STAGE/lib" "$STAGE/data/fashion-mnist"
cp "$BUILD/fusiontrain" "$STAGE/bin/"
cp "$BUILD"/tests/cuda_*_test "$BUILD/tests/mpi_nccl_test" "$STAGE/bin/tests/"

# Open MPI's runtime, for mpirun there: its launcher and daemon, plugins and help texts, relocated
# with OPAL_PREFIX; PMIx's plugins and help texts. Plugins that need fabric libraries
# (BUNDLE_FABRIC_LIBS) stay out, so nothing tries to load them there.
OMPI=$STAGE/ompi/usr
PLUGINS=$OMPI/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
PMIX=$OMPI/lib/x86_64-linux-gnu/pmix2
mkdir -p "$OMPI/bin" "$OMPI/etc" "$OMPI/share" "$PLUGINS" "$PMIX/lib" "$PMIX/share"
cp /usr/bin/orterun /usr/bin/orted "$OMPI/bin/" && ln -s orterun "$OMPI/bin/mpirun"
left_out=()
for plugin in /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so; do
  if ldd "$plugin" | awk '{print $1}' | grep -E "$BUNDLE_FABRIC_LIBS" | grep -q .; then
    left_out+=("$(basename "$plugin" .so)")
  else
    cp "$plugin" "$PLUGINS/"
  fi
done
cp -a /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix "$PMIX/lib/"
cp -a /usr/lib/x86_64-linux-gnu/pmix2/share/pmix "$PMIX/share/"
cp -a /usr/share/openmpi "$OMPI/share/"
# The settings Debian's /etc/openmpi file would give, read through OPAL_SYSCONFDIR (gpu_check.sh
# also exports them: environment variables win over this file).
{
  echo "# The GPU bundle's Open MPI settings (scripts/gpu_bundle_env.sh: BUNDLE_MCA_PARAMS)"
  for setting in "${BUNDLE_MCA_PARAMS[@]}"; do
    [[ $setting == OMPI_MCA_* ]] || continue
    setting=${setting#OMPI_MCA_}
    echo "${setting%%=*} = ${setting#*=}"
  done
} > "$OMPI/etc/openmpi-mca-params.conf"

# Every library the binaries and plugins load, but those the image brings (BUNDLE_IMAGE_LIBS).
bundle_files "$STAGE" | while read -r file; do ldd "$file"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
    [[ $name =~ $BUNDLE_IMAGE_LIBS ]] && continue
    cp -L "$path" "$STAGE/lib/$name"
  done
cp "$DATA"/*.gz "$STAGE/data/fashion-mnist/"
cp data/moby_dick.txt "$STAGE/data/"  # the GPT corpus is git-ignored, so the tree lacks it there

# The newest C runtime the bundle needs: the image's glibc and libstdc++ must be at least as new.
needs=$(bundle_files "$STAGE" | xargs objdump -T "$STAGE"/lib/* 2>/dev/null |
  grep -o 'GLIBC\(XX\)\?_[0-9.]*' | sort -u -V |
  awk -F_ '{newest[$1] = $0} END {for (k in newest) printf "%s ", newest[k]}')
{
  echo "source_dir=$ROOT"    # FT_SOURCE_DIR and FT_BINARY baked into the tests point here
  echo "build_dir=$BUILD"
  echo "march=${march:-native}"
  echo "commit=$(git rev-parse HEAD)$(git diff --quiet HEAD || echo -dirty)"
  echo "sources=$(bash scripts/source_hash.sh)"
  echo "needs=$needs"
  echo "ompi_left_out=${left_out[*]}"
  echo "made=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$STAGE/MANIFEST"

mkdir -p "$(dirname "$OUT_FILE")"
tar -C "$STAGE" -cf - . | xz -T0 "-${GPU_BUNDLE_XZ_LEVEL:-6}" > "$OUT_FILE.part"
mv "$OUT_FILE.part" "$OUT_FILE"
size=$(stat -c %s "$OUT_FILE")
echo "gpu_bundle: $OUT_FILE, $((size >> 20)) MiB: $(find "$STAGE/bin/tests" -type f | wc -l) tests," \
  "$(find "$STAGE/lib" -type f | wc -l) libraries, needs ${needs:-?}, commit $(sed -n 's/^commit=//p' "$STAGE/MANIFEST")"
max=${GPU_BUNDLE_MAX_MIB:-56}
[ "$size" -lt $((max << 20)) ] || { echo "gpu_bundle: over $max MiB, too big to carry" >&2; exit 1; }
