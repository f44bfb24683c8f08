#!/usr/bin/env bash
# Prints every test the last ctest run skipped, with the reason GoogleTest gave (ctest 3.25 shows
# only "Skipped"). Usage: bash scripts/skip_reasons.sh [BUILD_DIR]
set -euo pipefail
log="${1:-build}/Testing/Temporary/LastTest.log"
[ -f "$log" ] || { echo "skip_reasons: no $log (run ctest first)" >&2; exit 1; }
awk '
  /^[0-9]+\/[0-9]+ Test: / { name = $0; sub(/^[0-9]+\/[0-9]+ Test: /, "", name); reason = ""; next }
  /: Skipped$/ { getline reason; next }
  /^\[  SKIPPED \] .* \([0-9]+ ms\)$/ { skipped[name] = reason }
  END {
    count = 0
    for (test in skipped) { printf "skipped: %s: %s\n", test, skipped[test] | "sort"; ++count }
    close("sort")
    printf "%d test(s) skipped\n", count
  }' "$log"
