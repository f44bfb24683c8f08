#!/usr/bin/env bash
# A fake mpirun for tests/gpu_check_dry_run.sh: `--version` says Open MPI (or MPICH with
# FAKE_MPIRUN=mpich); otherwise it drops --oversubscribe, reads -np N and runs the command N
# times at once.
set -u
if [ "${1:-}" = --version ]; then
  [ "${FAKE_MPIRUN:-}" = mpich ] && echo "HYDRA build details: MPICH" || echo "mpirun (Open MPI) 4.1.4"
  exit 0
fi
ranks=1
while [ $# -gt 0 ]; do
  case $1 in
    --oversubscribe) shift ;;
    -np) ranks=$2; shift 2 ;;
    *) break ;;
  esac
done
pids=()
for ((rank = 0; rank < ranks; rank++)); do "$@" & pids+=($!); done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
exit "$rc"
