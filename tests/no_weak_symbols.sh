#!/usr/bin/env bash
# Fails when the object file compiled with AVX-512 flags (model/ops/winograd_avx512.cpp) defines a
# weak or unique symbol: the linker may pick such a definition (a standard template's instance) for
# the whole program, and on an AVX2 machine its AVX-512 instructions would crash code far from the
# kernels. Only data the C++ runtime shares (DW.ref.__gxx_personality_v0) is allowed. The CPU
# guard's object (core/cpu_guard.cpp, compiled for baseline x86-64) is checked the same way.
#   tests/no_weak_symbols.sh 1|0 "OBJECT;OBJECT;..." [NAME]   (1: the build compiled the file;
#   the objects of its library as CMake lists them; NAME, default winograd_avx512.cpp.o, picks
#   out the one to check)
set -euo pipefail
built="$1"
IFS=';' read -ra objects <<< "$2"
name="${3:-winograd_avx512.cpp.o}"
object=""
for candidate in "${objects[@]}"; do
  case "$candidate" in *"$name") object="$candidate" ;; esac
done
if [ "$built" != 1 ]; then
  echo "this build compiled no AVX-512 kernels (the compiler refused the flags): nothing to check"
  exit 0
fi
if [ -z "$object" ]; then
  echo "no $name is among: $2"
  exit 1
fi
weak=$(nm -C "$object" | awk '$2 ~ /^[WVu]$/ || $1 ~ /^[WVu]$/' | grep -v "DW.ref.__gxx_personality_v0" || true)
if [ -n "$weak" ]; then
  echo "$object defines weak symbols, which the linker may choose for every caller in the program:"
  echo "$weak"
  exit 1
fi
echo "$object: no weak symbols"
