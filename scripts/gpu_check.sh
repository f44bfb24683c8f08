#!/usr/bin/env bash
# GPU check of the CUDA path: one prepared run on a lent GPU machine (one H200, 16 cores, sm_90).
#
# The two device calls (the device tool's `run`, with carry ["gpu_bundle"]):
#   1. quick: command "GPU_CHECK_QUICK=1 bash scripts/gpu_check.sh", timeout_s 300
#      -> nvidia-smi, `fusiontrain --version` (the CUDA runtime and driver, cuBLASLt, cuDNN and
#         NCCL it loaded), every GPU test binary, gpt_tiny trained on cuda eager and as CUDA
#         graphs, then gpt_tiny and resnet8 eager in train.precision: bf16. Deadline 270 s.
#   2. full, if device time is left: command "bash scripts/gpu_check.sh", timeout_s 480
#      -> the same, then NCCL (its test at one rank; gpt_tiny through a real one-rank NCCL
#         allreduce, eager and graphs; bandwidth) and the benches. Deadline 420 s; with less time
#         left, add GPU_CHECK_DEADLINE=<timeout_s - 40> to the command.
#   Each brings back $OUT/gpu_check.json, the summary (ok, GPU, versions, each step's status,
#   exit code and seconds, timed-out and not-run steps, gtest counts), and
#   $OUT/gpu_check_logs.tar.gz (every log, gtest and bench JSON, training metrics). Both are
#   rewritten after every step, so a hang, a crash or a kill keeps every finished step.
# Before them, here (the GPU machine has another CPU, and cannot configure this project):
#   cmake -S . -B build-cuda -DFT_CUDA=ON -DFT_MARCH=x86-64-v3 && cmake --build build-cuda -j2 && bash scripts/gpu_bundle.sh build-cuda
#
# Steps, most valuable first: nvidia_smi, bundle (unpack; binaries where the tests expect them),
# bundle_libraries (ldd), version, each tests/cuda_*_test, train eager and graph, train bf16
# (gpt_tiny and resnet8, eager); then (not with
# GPU_CHECK_QUICK=1) nccl_np1, train through NCCL eager and graph, bandwidth NCCL (1 rank) and
# MPI-staged (2 ranks), and bench of gpt_tiny, gpt_small and resnet8 (MFU against PEAK_TFLOPS,
# default 67: an H200's dense FP32 without tensor cores, which train.tf32: false runs).
# Time: one deadline for the whole script (GPU_CHECK_DEADLINE seconds, default 420, 270 with
# GPU_CHECK_QUICK=1). A step runs for at most min(its cap, the time left), then gets TERM, and
# KILL 5 s later; a step due after the deadline is recorded "not run: deadline". Caps in seconds:
# GPU_CHECK_SETUP_CAP 60 (nvidia-smi, bundle, version), GPU_CHECK_TEST_CAP 120 (a gtest binary),
# GPU_CHECK_TRAIN_CAP 120, GPU_CHECK_MPI_CAP 60 (an mpirun), GPU_CHECK_BENCH_CAP 120.
# Exit status: 0 only when every step ran and passed. On a GPU machine a step not run (deadline,
# no mpirun), a timeout or a skipped GPU test is a failure.
# Binaries: the bundle gpu_bundle/bundle.tar.xz (GPU_BUNDLE names another) when it is there;
# GPU_CHECK_BUILD_DIR=DIR takes DIR's binaries as already built (tests/gpu_check_dry_run.sh runs
# fakes so); otherwise the script configures and builds into build-gpu.
# shellcheck disable=SC2317  # the traps and install_bundle are called indirectly
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
# shellcheck source=scripts/gpu_bundle_env.sh
source scripts/gpu_bundle_env.sh
RESULT_DIR=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$RESULT_DIR"
# The device tool brings back at most 8 files from $OUT: logs and JSON go to a work folder, which
# comes back as one archive beside the summary.
WORK=$(mktemp -d)
RUNS=$(mktemp -d)  # training runs: checkpoints stay out of the archive, metrics are copied in
LAST_STATUS=$RUNS/last_status  # the summary's verdict on the last step recorded
: > "$WORK/steps.tsv"
QUICK=${GPU_CHECK_QUICK:-0}
if [ "$QUICK" = 1 ]; then DEADLINE=${GPU_CHECK_DEADLINE:-270}; else DEADLINE=${GPU_CHECK_DEADLINE:-420}; fi
SETUP_CAP=${GPU_CHECK_SETUP_CAP:-60}
TEST_CAP=${GPU_CHECK_TEST_CAP:-120}
TRAIN_CAP=${GPU_CHECK_TRAIN_CAP:-120}
MPI_CAP=${GPU_CHECK_MPI_CAP:-60}
BENCH_CAP=${GPU_CHECK_BENCH_CAP:-120}
KILL_AFTER=5  # seconds between a step's TERM and its KILL
RESERVE=2     # seconds kept after the last step, for the results
BUNDLE=${GPU_BUNDLE:-gpu_bundle/bundle.tar.xz}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 NCCL_DEBUG=WARN
BUILD=""         # where the binaries are (their build folder, or the bundle's)
RUN='env'        # runs our binaries; the bundle's wrapper puts its libraries first
MPIRUN=mpirun
NOT_RUN=""       # when set, every further step is recorded as not run, for this reason
NO_MPIRUN=""     # likewise for the steps under mpirun
SETSID=(setsid)  # a step runs in a session of its own, so its leftovers can be found
command -v setsid > /dev/null || SETSID=()
STEP_PID="" STEP_NAME="" STEP_T0=0 FINISHED=0 FINAL_WRITTEN=0
START=$SECONDS

# write_results: the summary ($RESULT_DIR/gpu_check.json) and the archive of the work folder
# ($RESULT_DIR/gpu_check_logs.tar.gz) from steps.tsv and the logs; each is written beside its
# name and then renamed, so a kill mid-write leaves the previous one. Returns 0 when the check
# passed so far (every step passed, and the script reached its end).
write_results() {
  local verdict
  GC_DEADLINE=$DEADLINE GC_ELAPSED=$((SECONDS - START)) GC_FINISHED=$FINISHED GC_QUICK=$QUICK \
    python3 - "$WORK" "$LAST_STATUS" > "$WORK/gpu_check.json.part" 2> "$WORK/summary_error.log" <<'PY'
import json, os, sys
work, last_status = sys.argv[1], sys.argv[2]
steps = []
with open(os.path.join(work, "steps.tsv")) as f:
    for line in f:
        name, status, rc, seconds, limit, kind, reason = line.rstrip("\n").split("\t")
        steps.append({"name": name, "status": status, "rc": int(rc), "seconds": int(seconds),
                      "limit_s": int(limit), "kind": kind, "reason": reason})

def gtest_counts(path):
    with open(path) as f:
        report = json.load(f)
    cases = [case for suite in report.get("testsuites", []) for case in suite.get("testsuite", [])]
    skipped = [c["classname"] + "." + c["name"] for c in cases if c.get("result") == "SKIPPED"]
    failed = [c["classname"] + "." + c["name"] for c in cases if c.get("failures")]
    return {"tests": len(cases), "failed": failed, "skipped": skipped}

# A gtest step passes only with its JSON, at least one test, none failed and none skipped: a GPU
# test that skips on a GPU machine found the GPU unusable.
gtest = {}
for step in steps:
    if step["kind"] != "gtest" or step["status"] == "not_run":
        continue
    try:
        counts = gtest[step["name"]] = gtest_counts(os.path.join(work, step["name"] + ".gtest.json"))
    except (OSError, ValueError, KeyError, TypeError) as error:
        counts, problem = None, "no readable gtest JSON (%s)" % type(error).__name__
    if step["status"] != "passed":
        continue
    if counts is None:
        step["status"], step["reason"] = "failed", problem
    elif counts["failed"] or counts["skipped"] or not counts["tests"]:
        step["status"] = "failed"
        step["reason"] = "%d tests, %d failed, %d skipped" % (
            counts["tests"], len(counts["failed"]), len(counts["skipped"]))

def lines(name):
    try:
        with open(os.path.join(work, name)) as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    except OSError:
        return []

manifest = dict(line.split("=", 1) for line in lines("bundle_manifest.txt") if "=" in line)
finished = os.environ["GC_FINISHED"] == "1"
named = lambda status: [s["name"] for s in steps if s["status"] == status]
ok = finished and bool(steps) and all(s["status"] == "passed" for s in steps)
summary = {
    "ok": ok,
    "finished": finished,  # false: the script was stopped; the steps below are those it finished
    "quick": os.environ["GC_QUICK"] == "1",
    "deadline_s": int(os.environ["GC_DEADLINE"]),
    "elapsed_s": int(os.environ["GC_ELAPSED"]),
    "gpu": (lines("nvidia_smi.csv") or [""])[0],
    "versions": lines("version.stdout"),
    "failed": named("failed"),
    "timed_out": named("timed_out"),
    "interrupted": named("interrupted"),
    "not_run": {s["name"]: s["reason"] for s in steps if s["status"] == "not_run"},
    "exit_codes": {s["name"]: s["rc"] for s in steps if s["status"] != "not_run"},
    "gtest": gtest,
    "bundle": manifest,
    "steps": steps,
    "files": sorted(f for f in os.listdir(work) if not f.endswith(".part")),
}
json.dump(summary, sys.stdout, indent=1)
print()
if steps:
    with open(last_status, "w") as f:
        f.write(steps[-1]["status"] + (": " + steps[-1]["reason"] if steps[-1]["reason"] else ""))
sys.exit(0 if ok else 3)
PY
  verdict=$?
  if [ "$verdict" != 0 ] && [ "$verdict" != 3 ]; then  # no python3, or it failed: the raw lines
    {
      echo '{"ok": false, "summary_error": "python3 failed: see summary_error.log", "steps_tsv": ['
      sed 's/\\/\\\\/g; s/"/\\"/g; s/\t/ | /g; s/.*/  "&",/' "$WORK/steps.tsv"
      echo '  ""]}'
    } > "$WORK/gpu_check.json.part"
    verdict=1
  fi
  [ -s "$WORK/summary_error.log" ] || rm -f "$WORK/summary_error.log"
  mv "$WORK/gpu_check.json.part" "$WORK/gpu_check.json"
  cp "$WORK/gpu_check.json" "$RESULT_DIR/.gpu_check.json.part" &&
    mv "$RESULT_DIR/.gpu_check.json.part" "$RESULT_DIR/gpu_check.json"
  tar -C "$WORK" -czf "$RESULT_DIR/.gpu_check_logs.tar.gz.part" . &&
    mv "$RESULT_DIR/.gpu_check_logs.tar.gz.part" "$RESULT_DIR/gpu_check_logs.tar.gz"
  return "$verdict"
}

# time_left: the seconds a step may still be given (its KILL and the last results fit after them)
time_left() { echo $((DEADLINE - (SECONDS - START) - KILL_AFTER - RESERVE)); }

# record NAME STATUS RC SECONDS LIMIT KIND REASON: one line of steps.tsv, then the results are
# rewritten at once: a step counts only once it is in the archive.
record() {
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$WORK/steps.tsv"
  write_results
}

# kill_session SID: kills, by process id, whatever a finished step left running in its session
# (mpirun's ranks start process groups of their own, so timeout's group kill misses them).
kill_session() {
  local sid=$1 stat pid rest fields
  for stat in /proc/[0-9]*/stat; do
    read -r rest 2> /dev/null < "$stat" || continue  # gone meanwhile
    rest=${rest##*) }  # after the command name, which may hold spaces
    read -r -a fields <<< "$rest"
    [ "${fields[3]:-}" = "$sid" ] || continue
    pid=${stat#/proc/}
    kill -KILL "${pid%/stat}" 2> /dev/null
  done
}

# step KIND NAME CAP COMMAND...: runs COMMAND as step NAME (KIND gtest: it writes
# $WORK/NAME.gtest.json) for at most min(CAP, time left before the deadline), with its output in
# $WORK/NAME.log (its stdout in $STEP_STDOUT when set), then records it: passed, failed or
# timed_out (exit 124: TERM at the limit; 137: KILLed 5 s later). STEP_KEEP names a file copied
# in as NAME.<its name> first. After the deadline, or with NOT_RUN set, it only records the step
# as not run. Returns the command's exit status (1 when not run).
step() {
  local kind=$1 name=$2 cap=$3
  shift 3
  local left reason=$NOT_RUN
  left=$(time_left)
  [ -z "$reason" ] && ((left < 1)) && reason=deadline
  if [ -n "$reason" ]; then
    echo "== gpu_check: $name: not run: $reason"
    record "$name" not_run -1 0 0 "$kind" "$reason"
    return 1
  fi
  local limit=$((cap < left ? cap : left)) rc status=passed command="$*"
  ((${#command} <= 240)) || command="${command:0:240} ..."
  echo "== gpu_check: $name (at most ${limit}s): $command"
  STEP_NAME=$name STEP_T0=$SECONDS
  # In the background, so that a TERM to this script is handled at once, not after the step.
  if [ -n "${STEP_STDOUT:-}" ]; then
    "${SETSID[@]}" timeout -k "$KILL_AFTER" "$limit" "$@" > "$STEP_STDOUT" 2> "$WORK/$name.log" &
  else
    "${SETSID[@]}" timeout -k "$KILL_AFTER" "$limit" "$@" > "$WORK/$name.log" 2>&1 &
  fi
  STEP_PID=$!
  wait "$STEP_PID"
  rc=$?
  local session=$STEP_PID
  STEP_PID="" STEP_NAME=""
  [ ${#SETSID[@]} = 0 ] || kill_session "$session"
  if ((rc == 124 || rc == 137)); then
    status=timed_out reason="stopped at its limit of ${limit}s"
  elif ((rc != 0)); then
    status=failed
  fi
  [ -n "${STEP_KEEP:-}" ] && cp "$STEP_KEEP" "$WORK/$name.$(basename "$STEP_KEEP")" 2> /dev/null
  local seconds=$((SECONDS - STEP_T0))
  rm -f "$LAST_STATUS"
  record "$name" "$status" "$rc" "$seconds" "$limit" "$kind" "$reason"
  # The summary's verdict, which also reads a gtest step's JSON (a skipped test fails it).
  [ -f "$LAST_STATUS" ] && status=$(< "$LAST_STATUS")
  echo "== gpu_check: $name: $status (exit $rc, $seconds s)"
  [[ $status == passed ]] || tail -n 8 "$WORK/$name.log" | sed 's/^/    /'
  return "$rc"
}

# mpi_step KIND NAME MPIRUN_ARGS...: a step under mpirun, capped at GPU_CHECK_MPI_CAP; not run
# (a failure) where there is no Open MPI mpirun.
mpi_step() {
  local kind=$1 name=$2
  shift 2
  if [ -z "$NOT_RUN" ] && [ -n "$NO_MPIRUN" ]; then
    NOT_RUN=$NO_MPIRUN step "$kind" "$name" 0
    return 1
  fi
  step "$kind" "$name" "$MPI_CAP" "$MPIRUN" --oversubscribe "$@"
}

# The caller stopping the script (TERM, INT): the running step is killed and recorded as
# interrupted; the EXIT trap then writes the results, as it does however the script ends.
on_signal() {
  trap - TERM INT
  echo "== gpu_check: stopped by a signal${STEP_NAME:+ during $STEP_NAME}"
  if [ -n "$STEP_PID" ]; then
    kill -KILL "$STEP_PID" 2> /dev/null
    [ ${#SETSID[@]} = 0 ] || kill_session "$STEP_PID"
    record "$STEP_NAME" interrupted 143 "$((SECONDS - STEP_T0))" 0 plain "stopped by a signal"
  fi
  exit 143
}
on_exit() { [ "$FINAL_WRITTEN" = 1 ] || write_results; }
trap on_signal TERM INT
trap on_exit EXIT

# install_bundle BUNDLE DIR (run as a step, in a child bash): unpacks the bundle into DIR and
# puts its binaries and data where its tests look for them (the paths they were built with).
install_bundle() {
  local bundle=$1 unpacked=$2 source_dir build_dir sources
  bundle_unpack "$bundle" "$unpacked" || return 1
  cat "$unpacked/MANIFEST"
  # A bundle of other sources would test old binaries: remake it (scripts/gpu_bundle.sh).
  sources=$(bash scripts/source_hash.sh)
  if [ "$(sed -n 's/^sources=//p' "$unpacked/MANIFEST")" != "$sources" ]; then
    echo "bundle: built from other sources than this tree ($sources); run scripts/gpu_bundle.sh"
    return 1
  fi
  source_dir=$(sed -n 's/^source_dir=//p' "$unpacked/MANIFEST")
  build_dir=$(sed -n 's/^build_dir=//p' "$unpacked/MANIFEST")
  [[ $build_dir == /* ]] || build_dir=$source_dir/$build_dir
  # The tests name their configs and the binary by the paths they were built at.
  if [ "$source_dir" != "$PWD" ] && [ ! -e "$source_dir" ]; then
    mkdir -p "$(dirname "$source_dir")" && ln -s "$PWD" "$source_dir" || return 1
  fi
  mkdir -p "$build_dir/tests" && cp "$unpacked/bin/fusiontrain" "$build_dir/" &&
    cp "$unpacked"/bin/tests/* "$build_dir/tests/" || return 1
  [ -e data/moby_dick.txt ] || cp "$unpacked/data/moby_dick.txt" data/ || return 1
  if [ ! -e /usr/share/datasets/fashion-mnist ]; then
    mkdir -p /usr/share/datasets && ln -s "$unpacked/data/fashion-mnist" /usr/share/datasets/
  fi
}
export -f install_bundle bundle_unpack bundle_ldd_check
export BUNDLE_IMAGE_LIBS

echo "== gpu_check: deadline ${DEADLINE}s$([ "$QUICK" = 1 ] && echo ", quick"); results in $RESULT_DIR"
STEP_STDOUT=$WORK/nvidia_smi.csv step plain nvidia_smi "$SETUP_CAP" \
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

if [ -n "${GPU_CHECK_BUILD_DIR:-}" ]; then
  BUILD=$GPU_CHECK_BUILD_DIR
  echo "== gpu_check: the binaries of $BUILD, as built"
elif [ -f "$BUNDLE" ]; then
  UNPACKED=${GPU_CHECK_UNPACK_DIR:-/tmp/ft_gpu_bundle}
  if step plain bundle "$SETUP_CAP" bash -c 'install_bundle "$@"' _ "$BUNDLE" "$UNPACKED"; then
    cp "$UNPACKED/MANIFEST" "$WORK/bundle_manifest.txt"
    BUILD=$(sed -n 's/^build_dir=//p' "$UNPACKED/MANIFEST")
    [[ $BUILD == /* ]] || BUILD=$(sed -n 's/^source_dir=//p' "$UNPACKED/MANIFEST")/$BUILD
    # Its libraries for our binaries only (wrappers), its Open MPI relocated with its settings.
    bundle_env_setup "$UNPACKED"
    RUN=$BUNDLE_RUN MPIRUN=$BUNDLE_MPIRUN
    export BUNDLE_LIBRARY_PATH
    mapfile -t bundled < <(bundle_files "$UNPACKED")
    step plain bundle_libraries "$SETUP_CAP" bash -c 'bundle_ldd_check missing "$@"' _ "${bundled[@]}"
  else
    NOT_RUN="the bundle step failed"
  fi
else
  BUILD=build-gpu
  step plain configure "$SETUP_CAP" cmake -S . -B "$BUILD" -DFT_CUDA=ON \
      ${CMAKE_CUDA_ARCHITECTURES:+-DCMAKE_CUDA_ARCHITECTURES=$CMAKE_CUDA_ARCHITECTURES} &&
    step plain build "$DEADLINE" cmake --build "$BUILD" -j "$(nproc)" || NOT_RUN="the build failed"
fi
FT=$BUILD/fusiontrain

STEP_STDOUT=$WORK/version.stdout step plain version "$SETUP_CAP" "$RUN" "$FT" --version

# Each GPU test binary: every CUDA kernel against its CPU kernel, training on cuda against cpu,
# CUDA graphs, the cuda export.
shopt -s nullglob
gpu_tests=("$BUILD"/tests/cuda_*_test)
shopt -u nullglob
[ ${#gpu_tests[@]} -gt 0 ] || NOT_RUN=${NOT_RUN:-"no tests/cuda_*_test in $BUILD"} step gtest cuda_tests 0
for binary in "${gpu_tests[@]}"; do
  name=$(basename "$binary")
  step gtest "$name" "$TEST_CAP" "$RUN" "$binary" --gtest_output="json:$WORK/$name.gtest.json"
done

# The train job end to end on the GPU (logging, eval, checkpoints), eager and as CUDA-graph
# replays. TRAIN_COMMAND: the part every training step shares.
TRAIN_COMMAND=(train --config configs/gpt_tiny.yaml --set train.device=cuda --set train.steps=60
               --set train.eval_every=30)
for graph in false true; do
  name=train_gpt_tiny_cuda_graph_$graph
  STEP_KEEP=$RUNS/$name/metrics.jsonl step plain "$name" "$TRAIN_CAP" "$RUN" "$FT" \
    "${TRAIN_COMMAND[@]}" --set fusion.cuda_graph=$graph --set train.run_dir="$RUNS/$name"
done
# Mixed precision on the GPU (docs/mixed_precision.md): bf16 GEMM operands through cuBLASLt, the
# casts, the weight copies written by the optimizer; eager, so a failure names its op.
name=train_gpt_tiny_cuda_bf16
STEP_KEEP=$RUNS/$name/metrics.jsonl step plain "$name" "$TRAIN_CAP" "$RUN" "$FT" \
  "${TRAIN_COMMAND[@]}" --set train.precision=bf16 --set fusion.cuda_graph=false \
  --set train.run_dir="$RUNS/$name"
# The ResNet in bf16: cuDNN's bf16 convolutions (model/ops/conv2d_bf16.cu), BatchNorm+ReLU and
# BatchNorm+add+ReLU writing bf16, the folded eval graph's bf16 conv_bias; eager, fused as default.
name=train_resnet8_cuda_bf16
STEP_KEEP=$RUNS/$name/metrics.jsonl step plain "$name" "$TRAIN_CAP" "$RUN" "$FT" \
  train --config configs/resnet8.yaml --set train.device=cuda --set train.steps=60 \
  --set train.eval_every=30 --set data.test_limit=1024 --set train.precision=bf16 \
  --set fusion.cuda_graph=false --set train.run_dir="$RUNS/$name"

if [ "$QUICK" = 1 ]; then
  echo "== gpu_check: GPU_CHECK_QUICK=1: stops before NCCL and the benches"
else
  # Ours links Open MPI's libmpi, which only an Open MPI mpirun can start. (After the deadline
  # the steps below are not run anyway.)
  left=$(time_left)
  if [ -z "$NOT_RUN" ] && ((left > 0)); then
    [[ $(timeout -k 1 $((left < 10 ? left : 10)) "$MPIRUN" --version 2>&1) == *"Open MPI"* ]] ||
      NO_MPIRUN="no Open MPI mpirun on this machine"
  fi
  # NcclSharedGpu needs more ranks than GPUs, so one rank always skips it: left out, because a
  # skip fails this check.
  mpi_step gtest nccl_np1 -np 1 "$BUILD/tests/mpi_nccl_test" --gtest_filter=-NcclSharedGpu.* \
    --gtest_output="json:$WORK/nccl_np1.gtest.json"
  # GradSync's real NCCL allreduce at one rank (comm.single_rank_allreduce), eager and graphs.
  for graph in false true; do
    name=train_gpt_tiny_nccl_graph_$graph
    STEP_KEEP=$RUNS/$name/metrics.jsonl mpi_step plain "$name" -np 1 "$FT" "${TRAIN_COMMAND[@]}" \
      --set comm.backend=nccl --set comm.single_rank_allreduce=true \
      --set fusion.cuda_graph=$graph --set train.run_dir="$RUNS/$name"
  done
  mpi_step plain bandwidth_nccl_np1 -np 1 "$FT" bandwidth --backend nccl \
    --max-bytes 268435456 --json "$WORK/bandwidth_nccl_np1.json"
  mpi_step plain bandwidth_mpi_staged_np2 -np 2 "$FT" bandwidth --device cuda \
    --max-bytes 67108864 --json "$WORK/bandwidth_mpi_staged_np2.json"
  # Unfused, each strategy, all, and cuda_graph (the whole step replayed as one CUDA graph,
  # captured after two eager steps).
  for config in gpt_tiny gpt_small resnet8; do
    step plain "bench_$config" "$BENCH_CAP" "$RUN" "$FT" bench --config "configs/$config.yaml" \
      --set train.device=cuda --variants unfused,horizontal,vertical,all,cuda_graph \
      --steps 20 --warmup 3 --peak-tflops "${PEAK_TFLOPS:-67}" --json "$WORK/bench_$config.json"
  done
fi

FINISHED=1
write_results
rc=$?
FINAL_WRITTEN=1
# A digest, last, so that the tail of the output the device tool returns holds it.
python3 - "$RESULT_DIR/gpu_check.json" <<'PY' || cat "$RESULT_DIR/gpu_check.json"
import json, sys
s = json.load(open(sys.argv[1]))
count = lambda status: sum(step["status"] == status for step in s["steps"])
print("== gpu_check summary: ok=%s; %d steps: %d passed, %d failed, %d timed out, %d not run; %d s"
      " of %d" % (str(s["ok"]).lower(), len(s["steps"]), count("passed"), count("failed"),
                  count("timed_out"), count("not_run"), s["elapsed_s"], s["deadline_s"]))
print("gpu: %s\nversions: %s" % (s["gpu"] or "?", " | ".join(s["versions"]) or "?"))
for step in s["steps"]:
    print("  %-34s %-10s rc=%-4d %4d s  %s" % (step["name"], step["status"], step["rc"],
                                              step["seconds"], step["reason"]))
PY
echo "== gpu_check: $([ "$rc" = 0 ] && echo passed || echo FAILED) in $((SECONDS - START)) s;" \
  "$RESULT_DIR/gpu_check.json and gpu_check_logs.tar.gz (every log and JSON)"
exit "$rc"
