#!/usr/bin/env bash
# A fake of fusiontrain and of the GPU test binaries for tests/gpu_check_dry_run.sh, linked
# under their names. What it does is chosen per call by FAKE_<key> (default FAKE_DEFAULT):
#   pass      exits 0 (a gtest writes a JSON with one passed test; train writes its metrics)
#   fail      exits 1 (a gtest's JSON holds one failure)
#   skip      a gtest whose one test skipped, exit 0
#   hang      sleeps 1000 s
#   stubborn  ignores TERM and keeps sleeping, so only KILL ends it
#   orphan    leaves a child in a process group of its own (as mpirun's ranks are), then hangs
# key: the binary's name (cuda_a_test, mpi_nccl_test), or for fusiontrain its command:
# train_<cuda|nccl>_graph_<false|true>, bandwidth_<nccl|mpi>, bench_<config>.
# Each call appends its pid, its parent's and its sleeps' to $FAKE_STATE/pids, so the test can
# clean up after a killed script.
set -u
name=$(basename "$0")
echo "$$ $PPID" >> "$FAKE_STATE/pids"
gtest_json="" run_dir="" json="" backend=cuda graph=false config="" command=""
for arg in "$@"; do
  case $arg in
    --gtest_output=json:*) gtest_json=${arg#--gtest_output=json:} ;;
    train.run_dir=*) run_dir=${arg#train.run_dir=} ;;
    comm.backend=nccl) backend=nccl ;;
    fusion.cuda_graph=*) graph=${arg#fusion.cuda_graph=} ;;
    configs/*.yaml) config=$(basename "$arg" .yaml) ;;
  esac
done
if [ "$name" = fusiontrain ]; then
  command=${1:-}
  case $command in
    --version)
      printf '%s\n' "fusiontrain 0.5.0 (commit fake)" "CUDA runtime 13.0" "CUDA driver 13.0" \
        "cuBLASLt 13.1.0" "cuDNN 9.19.0" "NCCL 2.28.9"
      exit 0 ;;
    train) key=train_${backend}_graph_$graph ;;
    bandwidth) key=bandwidth_$([[ " $* " == *" --backend nccl "* ]] && echo nccl || echo mpi) ;;
    bench) key=bench_$config ;;
    *) echo "fake fusiontrain: unknown command $command" >&2; exit 2 ;;
  esac
  for ((i = 1; i <= $#; i++)); do [ "${!i}" = --json ] && { j=$((i + 1)); json=${!j}; }; done
else
  key=$name
fi
var=FAKE_$key
behavior=${!var:-${FAKE_DEFAULT:-pass}}
echo "fake $key: $behavior (NCCL_DEBUG=${NCCL_DEBUG:-unset})"

gtest_report() {  # gtest_report RESULT FAILURES: the JSON GoogleTest writes, one test
  [ -n "$gtest_json" ] || return 0
  printf '{"tests": 1, "testsuites": [{"name": "Fake", "testsuite": [{"name": "One",
    "classname": "Fake", "result": "%s", "failures": %s}]}]}\n' "$1" "$2" > "$gtest_json"
}
hang() {  # sleeps, its sleep's pid recorded too
  sleep 1000 &
  echo "$!" >> "$FAKE_STATE/pids"
  wait
}
case $behavior in
  pass)
    gtest_report COMPLETED '[]'
    if [ -n "$run_dir" ]; then mkdir -p "$run_dir" && echo '{"step": 60, "loss": 2.5}' > "$run_dir/metrics.jsonl"; fi
    if [ -n "$json" ]; then echo '{"fake": true}' > "$json"; fi
    exit 0 ;;
  fail) gtest_report COMPLETED '[{"failure": "fake failure"}]'; echo "fake $key failed" >&2; exit 1 ;;
  skip) gtest_report SKIPPED '[]'; exit 0 ;;
  hang) hang ;;
  stubborn) trap '' TERM; while :; do sleep 1; done ;;
  orphan)
    set -m  # the next background job gets a process group of its own
    sleep 1000 &
    echo "$!" >> "$FAKE_STATE/pids"
    echo "$!" > "$FAKE_STATE/orphan"
    set +m
    hang ;;
esac
exit 2
