#!/usr/bin/env bash
# Two "hosts" on one machine, made of network namespaces, run the README's hostfile recipe
# (docs/multi_node.md, "Try a cluster on one machine"):
#   - namespaces PFX-a and PFX-b (the hosts) and PFX-sw (a bridge, the "switch"), a veth pair
#     from each host to the bridge, addresses 10.77.0.1/24 (host-a) and 10.77.0.2/24 (host-b);
#     nothing is added to the machine's own network namespace;
#   - host.sh HOST CMD runs CMD on a host: its network namespace, and, through unshare --uts
#     --mount, its own hostname and an /etc/hosts naming both hosts (bind-mounted in a private
#     mount namespace; the real /etc/hosts is not touched). agent.sh is mpirun's plm_rsh_agent:
#     Open MPI calls it as `agent.sh HOST orted ...`, as it would call ssh;
#   - mpirun runs on host-a with hostfile "host-a slots=1 / host-b slots=1", btl self,tcp and
#     btl/oob_tcp_if_include 10.77.0.0/24, and --bind-to none (each host's daemon thinks it has
#     the machine to itself and would bind its rank to core 0, both ranks on one core).
# Checks:
#   1. a short 2-rank gpt_tiny training on the two hosts (rank 1 on host-b) logs per step the same
#      loss and grad_norm, bit for bit, as `mpirun -np 2` on one host;
#   2. rank 1 killed (SIGKILL) mid-run: the job ends within comm.timeout_s + slack with a non-zero
#      exit, mpirun's report names rank 1 on host-b, and no process is left on either host;
#   3. rank 1 stopped (SIGSTOP) mid-run: only the collective watchdog can see that; rank 0 reports
#      the wait (comm.timeout_s) and the job ends between timeout_s and timeout_s + slack, non-zero,
#      and no process is left (the stopped rank on host-b included).
# Everything is removed on exit, whatever happens (trap). Needs root and network namespaces;
# exit 77 (skipped, with the reason) without them.
# Usage: bash tests/two_hosts.sh FUSIONTRAIN   (from the source root: configs/, data/)
#        TWO_HOSTS_KEEP=1 keeps the temp folder (logs, run dirs, host.sh, agent.sh).
set -uo pipefail
FT_ARG=${1:?usage: two_hosts.sh FUSIONTRAIN}

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root to make network namespaces (run as root, as CI does)"
for tool in ip unshare mpirun timeout mount hostname; do
  command -v "$tool" >/dev/null 2>&1 || skip "$tool not found"
done
FT=$(readlink -f "$FT_ARG")
# The project may be rebuilding: wait (bounded) for the binary.
for _ in $(seq 1 30); do [ -x "$FT" ] && break; sleep 1; done
[ -x "$FT" ] || fail "$FT_ARG is not an executable"
[ -f configs/gpt_tiny.yaml ] || fail "run from the source root (configs/gpt_tiny.yaml not found)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

PFX=ft2h-$$                  # this run's namespaces: PFX-sw, PFX-a, PFX-b
SUBNET=10.77.0.0/24
TIMEOUT_S=5                  # comm.timeout_s of the kill and stop runs
SLACK_S=15
TMP=$(mktemp -d /tmp/ft2h.XXXXXX) || fail "mktemp"
BG=""                        # pid of a background job (timeout ... mpirun)

ns_kill_all() {  # ns_kill_all NS: SIGKILL every process in NS, bounded
  local _
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    [ -n "$(ip netns pids "$1" 2>/dev/null)" ] || return 0
    ip netns pids "$1" 2>/dev/null | xargs -r kill -9 2>/dev/null
    sleep 0.2
  done
}
cleanup() {
  local ns
  trap - EXIT INT TERM
  [ -n "$BG" ] && kill -9 "$BG" 2>/dev/null
  for ns in "$PFX-a" "$PFX-b" "$PFX-sw"; do
    if ip netns list 2>/dev/null | grep -q "^$ns\( \|$\)"; then
      ns_kill_all "$ns"
      ip netns del "$ns" 2>/dev/null   # takes its veth ends (and so the pairs) and the bridge
    fi
  done
  if [ -n "${TWO_HOSTS_KEEP:-}" ]; then echo "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 1' INT TERM

# Leftovers of earlier runs of this test that died without cleaning up: namespaces named
# ft2h-PID-{a,b,sw} whose PID no longer runs.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^ft2h-[0-9]+-(a|b|sw)$'); do
  pid=${ns#ft2h-}; pid=${pid%-*}
  if [ "$pid" != $$ ] && [ ! -e "/proc/$pid" ]; then
    echo "removing leftover namespace $ns"
    ns_kill_all "$ns"; ip netns del "$ns" 2>/dev/null
  fi
done

# --- the two hosts ---------------------------------------------------------------------------
err=$(ip netns add "$PFX-sw" 2>&1) || skip "cannot make a network namespace (ip netns add: $err)"
err=$(ip netns exec "$PFX-sw" unshare --uts --mount true 2>&1) \
  || skip "unshare --uts --mount does not work in a network namespace: $err"
ip netns add "$PFX-a" && ip netns add "$PFX-b" || fail "ip netns add"
err=$(ip -n "$PFX-sw" link add br0 type bridge 2>&1) || skip "no bridge device: $err"
ip -n "$PFX-sw" link set br0 up || fail "bridge up"
for h in a b; do
  err=$(ip link add eth0 netns "$PFX-$h" type veth peer name "port-$h" netns "$PFX-sw" 2>&1) \
    || skip "no veth pair: $err"
  ip -n "$PFX-sw" link set "port-$h" master br0 up || fail "port-$h on the bridge"
  ip -n "$PFX-$h" link set lo up && ip -n "$PFX-$h" link set eth0 up || fail "links up on $h"
done
ip -n "$PFX-a" addr add 10.77.0.1/24 dev eth0 && ip -n "$PFX-b" addr add 10.77.0.2/24 dev eth0 \
  || fail "addresses"

printf '127.0.0.1 localhost\n10.77.0.1 host-a\n10.77.0.2 host-b\n' >"$TMP/hosts"
printf 'host-a slots=1\nhost-b slots=1\n' >"$TMP/hostfile"
cat >"$TMP/host.sh" <<EOF
#!/bin/sh
# host.sh HOST CMD [ARG...]: run CMD on HOST: its network namespace, hostname and /etc/hosts.
case \$1 in
  host-a) ns=$PFX-a ;;
  host-b) ns=$PFX-b ;;
  *) echo "host.sh: unknown host \$1" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts --mount \\
  sh -c 'hostname "\$0" && mount --bind $TMP/hosts /etc/hosts && exec "\$@"' "\$@"
EOF
cat >"$TMP/agent.sh" <<EOF
#!/bin/sh
# agent.sh HOST CMD...: mpirun's plm_rsh_agent. Like ssh, runs CMD's words as one shell command.
host=\$1; shift
exec $TMP/host.sh "\$host" sh -c "\$*"
EOF
chmod +x "$TMP/host.sh" "$TMP/agent.sh"
got=$("$TMP/host.sh" host-b sh -c 'echo "$(hostname) $(grep -c host- /etc/hosts)"' 2>&1)
[ "$got" = "host-b 2" ] || fail "host.sh host-b: hostname and hosts file: got '$got'"

# mpirun on host-a, ranks on both hosts (hostfile order: rank 0 on host-a, rank 1 on host-b).
two_hosts_mpirun() {
  timeout -k 5 "$1" "$TMP/host.sh" host-a mpirun -np 2 --hostfile "$TMP/hostfile" \
    --mca plm_rsh_agent "$TMP/agent.sh" --mca btl self,tcp \
    --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET" \
    --bind-to none --report-bindings "${@:2}"
}
TRAIN=(train --config configs/gpt_tiny.yaml --set train.threads=1 --set train.log_every=1
       --set train.eval_every=0)
STEPS=8

nsteps() { local n; n=$(grep -c '"type":"step"' "$1" 2>/dev/null); echo "${n:-0}"; }
# step loss grad_norm, one line per step row of metrics.jsonl
losses() {
  grep '"type":"step"' "$1" 2>/dev/null |
    sed -E 's/.*"grad_norm":([^,}]*).*"loss":([^,}]*).*"step":([0-9]+).*/\3 \2 \1/'
}

# --- 1. same losses as one host --------------------------------------------------------------
echo "== one host: mpirun -np 2, $STEPS steps"
timeout -k 5 60 mpirun -np 2 --oversubscribe "$FT" "${TRAIN[@]}" --set train.steps=$STEPS \
  --set train.run_dir="$TMP/one" >"$TMP/one.log" 2>&1 || { tail -20 "$TMP/one.log"; fail "one-host run"; }
echo "== two hosts: mpirun on host-a, hostfile host-a + host-b, $STEPS steps"
start=$(date +%s%N)
two_hosts_mpirun 60 "$FT" "${TRAIN[@]}" --set train.steps=$STEPS --set train.run_dir="$TMP/two" \
  >"$TMP/two.log" 2>&1 || { tail -20 "$TMP/two.log"; fail "two-host run"; }
echo "   took $(( ($(date +%s%N) - start) / 1000000 )) ms"
grep -q '^\[host-b:[0-9]*\] MCW rank 1 ' "$TMP/two.log" \
  || { cat "$TMP/two.log"; fail "rank 1 did not run on host-b"; }
grep -q '^\[host-a:[0-9]*\] MCW rank 0 ' "$TMP/two.log" \
  || { cat "$TMP/two.log"; fail "rank 0 did not run on host-a"; }
losses "$TMP/one/metrics.jsonl" >"$TMP/one.losses"
losses "$TMP/two/metrics.jsonl" >"$TMP/two.losses"
echo "   step | one host: loss grad_norm | two hosts: loss grad_norm"
paste -d' ' "$TMP/one.losses" "$TMP/two.losses" | awk '{printf "   %4s | %s %s | %s %s\n", $1, $2, $3, $5, $6}'
[ "$(wc -l <"$TMP/one.losses")" -eq $STEPS ] || fail "one-host run logged $(wc -l <"$TMP/one.losses") steps, not $STEPS"
cmp -s "$TMP/one.losses" "$TMP/two.losses" || fail "two hosts and one host differ (loss or grad_norm)"
echo "   identical"

# --- 2. and 3. rank 1 on host-b killed or stopped mid-run ------------------------------------
# rank_dies SIGNAL: a long run with comm.timeout_s=TIMEOUT_S; once 3 steps are logged, send SIGNAL
# to the fusiontrain process on host-b; sets ELAPSED (s from the signal to mpirun's exit) and RC.
rank_dies() {
  local sig=$1 run=$TMP/$1 pid p t0 t1 _
  two_hosts_mpirun 90 "$FT" "${TRAIN[@]}" --set train.steps=100000 --set train.run_dir="$run" \
    --set comm.timeout_s=$TIMEOUT_S >"$run.log" 2>&1 &
  BG=$!
  for _ in $(seq 1 300); do   # at most 30 s
    [ "$(nsteps "$run/metrics.jsonl")" -ge 3 ] && break
    kill -0 "$BG" 2>/dev/null || break
    sleep 0.1
  done
  [ "$(nsteps "$run/metrics.jsonl")" -ge 3 ] \
    || { cat "$run.log"; fail "$sig run: 3 steps not logged within 30 s"; }
  pid=""
  for p in $(ip netns pids "$PFX-b"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = fusiontrain ] && pid=$p
  done
  [ -n "$pid" ] || fail "$sig run: no fusiontrain process on host-b"
  echo "   rank 1 on host-b is pid $pid; kill -$sig after $(nsteps "$run/metrics.jsonl") steps"
  kill "-$sig" "$pid"
  t0=$(date +%s%N)
  for _ in $(seq 1 $(((TIMEOUT_S + SLACK_S) * 10))); do
    kill -0 "$BG" 2>/dev/null || break
    sleep 0.1
  done
  t1=$(date +%s%N)
  ELAPSED=$(( (t1 - t0) / 1000000 ))
  if kill -0 "$BG" 2>/dev/null; then
    cat "$run.log"
    fail "$sig run: mpirun still running $((TIMEOUT_S + SLACK_S)) s after rank 1 got SIG$sig"
  fi
  wait "$BG"; RC=$?
  BG=""
  echo "   mpirun exited $RC, ${ELAPSED} ms after SIG$sig; what names a rank, host or process:"
  grep -E 'rank [0-9]|host:|Process name|Exit code' "$run.log" | grep -v 'MCW rank' | tail -6 |
    sed 's/^ */     /'
  [ "$RC" -ne 0 ] || fail "$sig run: mpirun exited 0"
  for _ in $(seq 1 50); do   # at most 5 s for the daemons to go
    [ -z "$(ip netns pids "$PFX-a")$(ip netns pids "$PFX-b")" ] && break
    sleep 0.1
  done
  for p in $(ip netns pids "$PFX-a") $(ip netns pids "$PFX-b"); do
    echo "   left: $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-100)"
  done
  [ -z "$(ip netns pids "$PFX-a")$(ip netns pids "$PFX-b")" ] \
    || fail "$sig run: processes left on the hosts 5 s after mpirun ended"
}

echo "== two hosts: kill -KILL rank 1 (host-b) mid-run, comm.timeout_s=$TIMEOUT_S"
rank_dies KILL
[ "$ELAPSED" -le $(((TIMEOUT_S + SLACK_S) * 1000)) ] || fail "KILL run: ended ${ELAPSED} ms after the kill"
grep -Eq 'process rank 1 with PID [0-9]+ on node host-b exited on signal 9' "$TMP/KILL.log" \
  || fail "KILL run: mpirun's output does not name rank 1 on host-b killed by signal 9"

echo "== two hosts: kill -STOP rank 1 (host-b) mid-run, comm.timeout_s=$TIMEOUT_S"
rank_dies STOP
[ "$ELAPSED" -ge $((TIMEOUT_S * 1000 - 1000)) ] && [ "$ELAPSED" -le $(((TIMEOUT_S + SLACK_S) * 1000)) ] \
  || fail "STOP run: ended ${ELAPSED} ms after the stop, not between comm.timeout_s and +${SLACK_S} s"
grep -Eq "rank 0: error: .* has waited $TIMEOUT_S s for the other ranks \(comm.timeout_s\)" "$TMP/STOP.log" \
  || fail "STOP run: no watchdog report from rank 0 naming comm.timeout_s"

echo "PASS"
