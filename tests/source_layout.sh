#!/usr/bin/env bash
# The source's two house rules, checked on the tracked files of the checkout at $1:
#  1. No include runs up the layers: core -> kernels -> model -> fusion / comm -> app. A folder may
#     include its own layer and those below it; fusion and comm do not include each other.
#     tests/, bench/ and fuzz/ may include anything.
#  2. No file of ours is over 450 lines (C++, CUDA, Python and shell), so each stays readable.
# Prints every breach and exits 1 when there is one.
set -euo pipefail
cd "$1"
status=0

allowed_below() {  # the folders a file under $1 may include from
  case "$1" in
    core) echo "core" ;;
    kernels) echo "core kernels" ;;
    model) echo "core kernels model" ;;
    fusion) echo "core kernels model fusion" ;;
    comm) echo "core kernels model comm" ;;
    app) echo "core kernels model fusion comm app" ;;
  esac
}

for layer in core kernels model fusion comm app; do
  allowed=" $(allowed_below "$layer") "
  while IFS= read -r file; do
    while IFS= read -r included; do
      folder=${included%%/*}
      if [[ "$allowed" != *" $folder "* ]]; then
        echo "layering: $file includes \"$included\" ($layer may include only:$allowed)"
        status=1
      fi
    done < <(sed -n 's/^#include "\([a-z_0-9]*\/[^"]*\)".*/\1/p' "$file")
  done < <(git ls-files "$layer/" | grep -E '\.(h|cpp|cu|cuh)$' || true)
done

limit=450
while IFS= read -r file; do
  lines=$(wc -l < "$file")
  if (( lines > limit )); then
    echo "length: $file has $lines lines (at most $limit: split it by concern)"
    status=1
  fi
done < <(git ls-files | grep -E '\.(h|cpp|cu|cuh|py|sh)$' | grep -v '^shared/')

exit $status
