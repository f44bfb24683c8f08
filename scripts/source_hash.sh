#!/usr/bin/env bash
# Prints a short hash of the sources a CUDA build is made from (C++/CUDA files and CMake lists),
# without git (the lent GPU machine's copy of the tree has no .git): gpu_bundle.sh records it in
# the bundle's MANIFEST and gpu_check.sh refuses a bundle built from other sources.
set -euo pipefail
cd "$(dirname "$0")/.."
find app bench comm core fusion model tests CMakeLists.txt -type f \
  \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name 'CMakeLists.txt' \) \
  -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
