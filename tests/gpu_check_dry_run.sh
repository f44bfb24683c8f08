#!/usr/bin/env bash
# Dry run of scripts/gpu_check.sh, here without a GPU: fake binaries (tests/gpu_check_fixtures)
# that pass, fail, skip, hang, ignore TERM and leave processes behind, with a short deadline and
# caps of a few seconds. Checks that the deadline holds, that every finished step's status, exit
# code and log reach the summary and the archive, that a step not run or timed out fails the
# check, that a check of passing fakes passes, and that a TERM or a KILL of the script mid-run
# leaves the summary and the archive of the steps it finished.
# Usage: bash tests/gpu_check_dry_run.sh [BUILD_DIR]   (BUILD_DIR unused: the binaries are fakes)
# GPU_CHECK_SCRIPT runs another copy of gpu_check.sh (to see this test fail on a broken one).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SCRIPT=${GPU_CHECK_SCRIPT:-scripts/gpu_check.sh}
FIXTURES=$PWD/tests/gpu_check_fixtures
T=$(mktemp -d)
export FAKE_STATE=$T/state
mkdir -p "$FAKE_STATE" "$T/build/tests" "$T/bin" "$T/tmp"
: > "$FAKE_STATE/pids"
cleanup() {  # the fakes a killed script left running, by the process ids they recorded
  local pid
  for pid in $(< "$FAKE_STATE/pids"); do kill -KILL "$pid" 2> /dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT

ln -s "$FIXTURES/fake_binary.sh" "$T/build/fusiontrain"
for name in cuda_a_test cuda_b_test cuda_c_test cuda_d_test cuda_e_test mpi_nccl_test; do
  ln -s "$FIXTURES/fake_binary.sh" "$T/build/tests/$name"
done
ln -s "$FIXTURES/fake_mpirun.sh" "$T/bin/mpirun"
ln -s "$FIXTURES/fake_nvidia_smi.sh" "$T/bin/nvidia-smi"

failures=0
check() {  # check DESCRIPTION COMMAND...: one assertion
  if "${@:2}"; then echo "ok:   $1"; else echo "FAIL: $1"; failures=$((failures + 1)); fi
}
# query OUT PYTHON_EXPRESSION: evaluates the expression on run OUT's summary `s` (exit 0 if true)
query() {
  python3 - "$T/$1/gpu_check.json" "$2" <<'PY'
import json, sys
with open(sys.argv[1]) as f:
    s = json.load(f)
status = {step["name"]: step["status"] for step in s["steps"]}
rc = {step["name"]: step["rc"] for step in s["steps"]}
ok = eval("(" + sys.argv[2] + ")")
if not ok:
    print("    not true: %s\n    steps: %s\n    not_run: %s" % (sys.argv[2], status, s["not_run"]))
sys.exit(0 if ok else 1)
PY
}
archived() {  # archived OUT FILE...: the archive of run OUT holds each FILE
  local listing file
  listing=$(tar -tzf "$T/$1/gpu_check_logs.tar.gz") || return 1
  for file in "${@:2}"; do
    grep -qx "\./$file" <<< "$listing" || { echo "    not in the archive: $file"; return 1; }
  done
}
only_results() {  # only_results OUT: the summary and the archive, no half-written file
  [ "$(find "$T/$1" -type f | sort | tr '\n' ' ')" = "$T/$1/gpu_check.json $T/$1/gpu_check_logs.tar.gz " ]
}
logged() {  # logged OUT TEXT LOG...: each LOG in run OUT's archive holds TEXT
  local log
  for log in "${@:3}"; do
    tar -xzOf "$T/$1/gpu_check_logs.tar.gz" "./$log" | grep -qF "$2" ||
      { echo "    $log lacks: $2"; return 1; }
  done
}
dead() {  # dead PID: no such process, or only its zombie (this container's init reaps late)
  local stat
  read -r stat 2> /dev/null < "/proc/$1/stat" || return 0
  stat=${stat##*) }
  [ "${stat%% *}" = Z ] && return 0
  echo "    alive: $1 ($(tr '\0' ' ' < "/proc/$1/cmdline"))"
  return 1
}
at_most() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }  # at_most A B: A <= B
# gpu_check OUT ENV...: runs the script with the fakes and ENV, output in $T/OUT.log, stopped
# after 40 s should its deadline fail; its exit status and seconds go to $T/OUT.rc.
gpu_check() {
  local out=$1 start
  shift
  start=$(date +%s.%N)
  env PATH="$T/bin:$PATH" TMPDIR="$T/tmp" OUT="$T/$out" GPU_CHECK_BUILD_DIR="$T/build" "$@" \
    timeout -k 1 90 bash "$SCRIPT" > "$T/$out.log" 2>&1
  echo "$? $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')" > "$T/$out.rc"
}
result() {  # result OUT: RC and WALL of run OUT
  read -r RC WALL < "$T/$1.rc"
  echo "== $1: exit $RC in ${WALL}s"
}

# A: every kind of trouble, deadline 60 s (30 s ran out before the last passing step on a CI
# machine busy with other tests: each step's results are rewritten, which costs time under
# load). The tests and mpiruns are capped at 2 s, so the one
# that ignores TERM takes 2 + 5 s; the benches' cap (100 s) is above the deadline, so the first
# is cut by the deadline itself (its KILL lands on the deadline) and the others are not run.
# It runs in the background, beside B to E.
gpu_check A GPU_CHECK_DEADLINE=60 GPU_CHECK_SETUP_CAP=5 GPU_CHECK_TEST_CAP=2 GPU_CHECK_TRAIN_CAP=2 \
  GPU_CHECK_MPI_CAP=2 GPU_CHECK_BENCH_CAP=100 FAKE_cuda_b_test=fail FAKE_cuda_c_test=orphan \
  FAKE_cuda_d_test=stubborn FAKE_cuda_e_test=skip FAKE_train_cuda_graph_true=fail \
  FAKE_train_nccl_graph_true=hang FAKE_bench_gpt_tiny=stubborn &
A_PID=$!

# B: every fake passes: the check passes. C: the same, quick: stops after the training runs.
gpu_check B GPU_CHECK_DEADLINE=60
gpu_check C GPU_CHECK_QUICK=1
# D: mpirun is not Open MPI's: its steps are not run, and that fails the check.
gpu_check D GPU_CHECK_DEADLINE=60 FAKE_MPIRUN=mpich
# E: no binaries but a bundle that cannot be unpacked: every step after it is not run.
echo "not a bundle" > "$T/bad.tar.xz"
gpu_check E GPU_CHECK_DEADLINE=60 GPU_CHECK_BUILD_DIR= GPU_BUNDLE="$T/bad.tar.xz" \
  GPU_CHECK_UNPACK_DIR="$T/unpacked"
wait "$A_PID"

result A
check "A: exit status non-zero" [ "$RC" != 0 ]
check "A: ends by the deadline (60 s + 2 s slack), took $WALL s" at_most "$WALL" 62
check "A: summary and archive only" only_results A
check "A: ok false, finished" query A 'not s["ok"] and s["finished"] and s["deadline_s"] == 60'
check "A: passed steps" query A 'all(status[n] == "passed" for n in ["nvidia_smi", "version",
  "cuda_a_test", "train_gpt_tiny_cuda_graph_false", "nccl_np1", "train_gpt_tiny_nccl_graph_false",
  "bandwidth_nccl_np1", "bandwidth_mpi_staged_np2"])'
check "A: failed steps (a failing gtest, a skipped gtest, a failing run)" query A \
  'status["cuda_b_test"] == status["cuda_e_test"] == status["train_gpt_tiny_cuda_graph_true"] == "failed"
   and rc["cuda_b_test"] == 1 and rc["cuda_e_test"] == 0
   and set(s["failed"]) == {"cuda_b_test", "cuda_e_test", "train_gpt_tiny_cuda_graph_true"}'
check "A: timed out: TERM (124), KILL of a TERM-ignoring step (137), a hung mpirun" query A \
  'rc["cuda_c_test"] == 124 and rc["cuda_d_test"] == 137 and rc["train_gpt_tiny_nccl_graph_true"] == 124
   and {"cuda_c_test", "cuda_d_test", "train_gpt_tiny_nccl_graph_true"} <= set(s["timed_out"])'
check "A: the last bench not run: deadline; the first cut by it" query A \
  's["not_run"].get("bench_resnet8") == "deadline" and set(s["not_run"].values()) == {"deadline"}
   and (rc["bench_gpt_tiny"] == 137 or status["bench_gpt_tiny"] == "not_run")'
check "A: gtest counts" query A 's["gtest"]["cuda_a_test"] == {"tests": 1, "failed": [], "skipped": []}
  and s["gtest"]["cuda_b_test"]["failed"] == ["Fake.One"] and s["gtest"]["cuda_e_test"]["skipped"] == ["Fake.One"]'
check "A: versions and GPU" query A 's["versions"] == ["fusiontrain 0.5.0 (commit fake)", "CUDA runtime 13.0",
  "CUDA driver 13.0", "cuBLASLt 13.1.0", "cuDNN 9.19.0", "NCCL 2.28.9"]
  and s["gpu"] == "NVIDIA H200, 570.86.15, 143771 MiB"'
check "A: finished steps' logs, gtest JSON and metrics archived" archived A steps.tsv gpu_check.json \
  version.stdout cuda_a_test.log cuda_a_test.gtest.json cuda_b_test.log cuda_d_test.log \
  train_gpt_tiny_cuda_graph_false.log train_gpt_tiny_cuda_graph_false.metrics.jsonl nccl_np1.log \
  train_gpt_tiny_nccl_graph_true.log bandwidth_nccl_np1.json
check "A: NCCL_DEBUG=WARN for our binaries and mpirun's ranks" logged A "NCCL_DEBUG=WARN" \
  cuda_a_test.log nccl_np1.log
check "A: the hung step's left-behind process was killed" dead "$(cat "$FAKE_STATE/orphan")"

result B
check "B: all pass: exit 0" [ "$RC" = 0 ]
check "B: ok, 19 steps passed, none not run" query B \
  's["ok"] and len(s["steps"]) == 19 and set(status.values()) == {"passed"} and not s["not_run"]'
result C
check "C: quick passes: exit 0" [ "$RC" = 0 ]
check "C: quick stops after training, deadline 270 s" query C 's["ok"] and s["quick"] and
  s["deadline_s"] == 270 and s["steps"][-1]["name"] == "train_resnet8_cuda_bf16"
  and "nccl_np1" not in status'

result D
check "D: no Open MPI mpirun: exit status non-zero" [ "$RC" != 0 ]
check "D: the mpirun steps not run (a failure), the rest passed" query D 'not s["ok"] and
  sorted(s["not_run"]) == ["bandwidth_mpi_staged_np2", "bandwidth_nccl_np1", "nccl_np1",
  "train_gpt_tiny_nccl_graph_false", "train_gpt_tiny_nccl_graph_true"]
  and all(r.startswith("no Open MPI mpirun") for r in s["not_run"].values())
  and status["bench_resnet8"] == "passed"'

result E
check "E: bad bundle: exit status non-zero" [ "$RC" != 0 ]
check "E: bundle failed, the rest not run" query E 'status["bundle"] == "failed" and
  status["nvidia_smi"] == "passed" and set(s["not_run"].values()) == {"the bundle step failed"}
  and {"version", "cuda_tests", "train_gpt_tiny_cuda_graph_false"} <= set(s["not_run"])'
check "E: Python's tarfile tried when tar -xJf fails" logged E "unpacking with Python's tarfile" \
  bundle.log

# F and G: the script stopped while cuda_c_test hangs (its cap 30 s): by TERM, which it traps,
# and by KILL, which it cannot. start_stopped OUT SIGNAL: starts it, sends SIGNAL once two
# tests are in its summary, and waits for it.
start_stopped() {
  local out=$1 signal=$2 pid i
  env PATH="$T/bin:$PATH" TMPDIR="$T/tmp" OUT="$T/$out" GPU_CHECK_BUILD_DIR="$T/build" \
    GPU_CHECK_TEST_CAP=30 FAKE_cuda_b_test=fail FAKE_cuda_c_test=orphan \
    bash "$SCRIPT" > "$T/$out.log" 2>&1 &
  pid=$!
  for ((i = 0; i < 100; i++)); do
    grep -q '"cuda_b_test"' "$T/$out/gpu_check.json" 2> /dev/null && break
    sleep 0.1
  done
  sleep 1  # into cuda_c_test
  STOPPED_AT=$(date +%s.%N)
  kill "-$signal" "$pid"
  wait "$pid"
  RC=$?
  WALL=$(awk -v a="$STOPPED_AT" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "== $out: $signal, exit $RC ${WALL}s later"
}
start_stopped F TERM
check "F: TERM: exit 143" [ "$RC" = 143 ]
check "F: TERM: ends at once (within 3 s), took $WALL s" at_most "$WALL" 3
check "F: TERM: the running step interrupted, the finished ones kept" query F 'not s["ok"]
  and not s["finished"] and status["cuda_c_test"] == "interrupted" and status["cuda_a_test"] == "passed"
  and status["cuda_b_test"] == "failed" and s["interrupted"] == ["cuda_c_test"]'
check "F: TERM: finished steps archived" archived F cuda_a_test.log cuda_b_test.log cuda_c_test.log
check "F: TERM: the running step and what it left behind killed" dead "$(cat "$FAKE_STATE/orphan")"
start_stopped G KILL
check "G: KILL: a summary of the steps finished before" query G 'not s["ok"] and not s["finished"]
  and status["cuda_a_test"] == "passed" and status["cuda_b_test"] == "failed" and "cuda_c_test" not in status'
check "G: KILL: their logs archived" archived G version.stdout cuda_a_test.log cuda_b_test.log \
  cuda_a_test.gtest.json

if [ "$failures" != 0 ]; then
  echo "gpu_check_dry_run: $failures checks failed; the script's output:"
  for log in "$T"/*.log; do echo "--- $log"; tail -n 40 "$log"; done
  exit 1
fi
echo "gpu_check_dry_run: all checks passed"
