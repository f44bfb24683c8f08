#!/usr/bin/env bash
# CUDA_COMPILER_LAUNCHER of our .cu files (cmake/cuda.cmake): runs one nvcc compile, which was
# given --resource-usage, and keeps ptxas's report of every kernel (registers, stack frame,
# spills, shared memory) beside the object as OBJECT.resource-usage, where
# tests/cuda_resources.py reads it. The report stays out of the build log; everything else nvcc
# says passes through, and its exit status is nvcc's.
set -uo pipefail
object=""
previous=""
for argument in "$@"; do
  [ "$previous" = "-o" ] && object=$argument
  previous=$argument
done
said=$(mktemp)
"$@" 2>"$said"
status=$?
grep -v -E '^ptxas info|^ +[0-9]+ bytes stack frame' "$said" >&2
if [ -n "$object" ] && [ "$status" = 0 ]; then
  grep -E '^ptxas info|^ +[0-9]+ bytes stack frame' "$said" >"$object.resource-usage"
fi
rm -f "$said"
exit "$status"
