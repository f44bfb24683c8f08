#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan, in build-fuzz/) and runs one.
#   bash scripts/fuzz.sh build                   build (or bring up to date) every target
#   bash scripts/fuzz.sh TARGET [SECONDS] [ARGS]  fuzz TARGET for SECONDS (default 60)
# TARGET: config, safetensors, idx or bench_variants. ARGS go to libFuzzer as they are.
# The run starts from a temporary copy of fuzz/corpus/TARGET (set FUZZ_CORPUS=DIR to keep and
# grow a corpus of your own instead) with fuzz/dict/TARGET.dict, -rss_limit_mb=2048, -timeout=10.
# Exit status: 0 clean; 1 a finding (crash, leak, timeout, out of memory, sanitizer report;
# the reproducer is kept in build-fuzz/artifacts/ and printed as hex) or a broken build; 77 when
# clang or libFuzzer is missing (ctest shows the test as skipped with the reason).
# FUZZ_BUILD_DIR (default build-fuzz) and FUZZ_BUILD_JOBS (default 2) change the build.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

targets="config safetensors idx bench_variants"
what="${1:-}"
if [ -z "$what" ] || { [ "$what" != build ] && ! grep -qw -- "$what" <<<"$targets"; }; then
  echo "usage: scripts/fuzz.sh build | {${targets// /|}} [SECONDS] [libFuzzer args...]" >&2
  exit 2
fi
shift
seconds="${1:-60}"
[ $# -gt 0 ] && shift
case "$seconds" in '' | *[!0-9]*)
  echo "fuzz: SECONDS must be a whole number, got '$seconds'" >&2
  exit 2
  ;;
esac

build_dir="${FUZZ_BUILD_DIR:-build-fuzz}"
case "$build_dir" in /*) ;; *) build_dir="$root/$build_dir" ;; esac
skip() {
  echo "fuzz: SKIPPED: $1" >&2
  exit 77
}

# The toolchain: clang++ that links -fsanitize=fuzzer (libFuzzer ships in libclang-rt-*-dev).
command -v clang++ >/dev/null 2>&1 || skip "no clang++ (scripts/bootstrap.sh installs clang)"
command -v cmake >/dev/null 2>&1 || skip "no cmake"
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  >"$probe/probe.cpp"
if ! clang++ -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" \
  >"$probe/log" 2>&1; then
  sed 's/^/  | /' "$probe/log" >&2
  skip "clang++ cannot link -fsanitize=fuzzer,address,undefined (libFuzzer missing: install libclang-rt-dev)"
fi

# One build at a time: parallel ctest jobs wait here for the first one's build.
mkdir -p "$build_dir"
exec 9>"$build_dir/.build.lock"
flock 9
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S fuzz -B "$build_dir" -DCMAKE_CXX_COMPILER=clang++ >"$probe/log" 2>&1 ||
    { sed 's/^/  | /' "$probe/log" >&2; echo "fuzz: cmake configure of $build_dir failed" >&2; exit 1; }
fi
cmake --build "$build_dir" -j"${FUZZ_BUILD_JOBS:-2}" >"$probe/log" 2>&1 ||
  { tail -n 60 "$probe/log" | sed 's/^/  | /' >&2; echo "fuzz: building $build_dir failed" >&2; exit 1; }
flock -u 9
[ "$what" = build ] && { echo "fuzz: targets built in $build_dir"; exit 0; }

binary="$build_dir/${what}_fuzzer"
corpus="${FUZZ_CORPUS:-}"
if [ -z "$corpus" ]; then
  corpus="$probe/corpus"
  mkdir -p "$corpus"
  cp fuzz/corpus/"$what"/* "$corpus"/
else
  mkdir -p "$corpus"
  cp -n fuzz/corpus/"$what"/* "$corpus"/ 2>/dev/null || true
fi
artifacts="$probe/artifacts"
mkdir -p "$artifacts"
log="$probe/fuzz.log"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:handle_abort=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
echo "fuzz: $what for ${seconds}s: $binary $corpus -dict=fuzz/dict/$what.dict" \
  "-max_total_time=$seconds -rss_limit_mb=2048 -timeout=10 $*"
status=0
"$binary" "$corpus" -dict="fuzz/dict/$what.dict" -max_total_time="$seconds" -rss_limit_mb=2048 \
  -timeout=10 -artifact_prefix="$artifacts/" -print_final_stats=1 "$@" >"$log" 2>&1 || status=$?

grep -E '^(#[0-9]+[[:space:]]+(INITED|DONE)|Done [0-9]+ runs|stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb))' \
  "$log" || true
found=$(ls -A "$artifacts")
reported=$(grep -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer|UndefinedBehaviorSanitizer)|runtime error:|FUZZ FINDING|SUMMARY: ' "$log" || true)
if [ "$status" -eq 0 ] && [ -z "$found" ] && [ -z "$reported" ]; then
  echo "fuzz: $what: no findings"
  exit 0
fi

echo "fuzz: $what: FINDING (libFuzzer exit status $status)" >&2
grep -n -E -B2 -A40 'ERROR: |runtime error:|FUZZ FINDING' "$log" | head -n 120 >&2 || tail -n 60 "$log" >&2
keep="$build_dir/artifacts/$what-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$keep"
cp "$log" "$keep/fuzz.log"
for file in "$artifacts"/*; do
  [ -e "$file" ] || continue
  cp "$file" "$keep/"
  echo "reproducer: $keep/$(basename "$file") ($(stat -c %s "$file") bytes), as hex:" >&2
  head -c 4096 "$file" | od -An -tx1 -v >&2
  echo "rerun: $binary $keep/$(basename "$file")" >&2
done
echo "fuzz: full log: $keep/fuzz.log" >&2
exit 1
