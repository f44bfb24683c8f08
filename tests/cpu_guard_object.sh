#!/usr/bin/env bash
# Checks what makes the CPU guard (core/cpu_guard.h) able to run on any x86-64 CPU: its object has
# no instruction beyond baseline x86-64 and defines no weak symbol (which the linker could swap for another
# file's copy, compiled with the build's flags), and the fusiontrain binary holds its constructor.
#   tests/cpu_guard_object.sh "OBJECT;OBJECT;..." FUSIONTRAIN   (the objects of ft_core)
set -euo pipefail
IFS=';' read -ra objects <<< "$1"
binary="$2"
object=""
for candidate in "${objects[@]}"; do
  case "$candidate" in *cpu_guard.cpp.o) object="$candidate" ;; esac
done
if [ -z "$object" ]; then
  echo "no cpu_guard.cpp.o among: $1"
  exit 1
fi
# VEX/EVEX-encoded instructions (v...: every SSE instruction once AVX is enabled) and BMI, LZCNT,
# POPCNT or MOVBE ones are what a build with -march beyond x86-64 puts in this code.
wide=$(objdump -d --no-show-raw-insn "$object" |
  awk -F'\t' 'NF >= 2 { split($2, word, " "); print word[1] "\t" $0 }' |
  grep -E '^(v[a-z0-9]+|andn|bextr|blsi|blsmsk|blsr|bzhi|tzcnt|lzcnt|popcnt|mulx|pdep|pext|rorx|sarx|shlx|shrx|movbe)'$'\t' || true)
if [ -n "$wide" ]; then
  echo "$object uses instructions beyond baseline x86-64, so the guard could fault itself:"
  echo "$wide" | head -20
  exit 1
fi
bash "$(dirname "$0")/no_weak_symbols.sh" 1 "$1" cpu_guard.cpp.o
symbols=$(nm -C "$binary")  # whole, since grep -q would cut nm's pipe under pipefail
if ! grep -q "refuse_a_cpu_without_the_build_isa" <<< "$symbols"; then
  echo "$binary does not contain the CPU guard's constructor"
  exit 1
fi
echo "$object: baseline code, no weak symbols; $binary holds the guard"
