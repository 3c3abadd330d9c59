#!/usr/bin/env bash
# What watchers cost writes: one 3-node Keel cluster at its defaults, the same keel-bench put
# case run with no watcher, with WATCHERS watchers that read everything (`keel watch` of the
# whole keyspace into /dev/null) and with WATCHERS watchers that never read (`keel watch`
# into a pipe nobody reads: once the pipe and the stream's buffers are full, the stream
# waits on its reader), the three in turn, REPEATS times, the order rotating. Prints one line
# per run (keel-bench's: errors, ops/s, latencies). The watchers are client processes on the
# same two cores as the servers: the "read" rows include their CPU, the "stalled" rows
# hardly any.
#
#   bench/watchers.sh KEEL
#   env: CASE=put:16 (op:clients), WATCHERS=20, REPEATS=3, DURATION=8s,
#        BENCH=target/release/keel-bench
#
# Build first: `cargo build --release -p keel-cli -p keel-bench`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
[ $# -eq 1 ] || { sed -n '2,14p' "$0"; exit 2; }
KEEL=$1
[ -x "$KEEL" ] || { echo "watchers.sh: $KEEL is not an executable" >&2; exit 2; }
BENCH=${BENCH:-$ROOT/target/release/keel-bench}
CASE=${CASE:-put:16} WATCHERS=${WATCHERS:-20}
REPEATS=${REPEATS:-3} DURATION=${DURATION:-8s}
PORT=27700 CONNECTIONS_MAX=8 READY_TIMEOUT_S=90 STOP_TIMEOUT_S=10
WORK=$(mktemp -d "${TMPDIR:-/tmp}/keel-watchers.XXXXXX")
SERVER_PIDS=()
declare -A SERVER_NAME=()
WATCHER_PIDS=()

stop_watchers() {
  [ ${#WATCHER_PIDS[@]} -eq 0 ] && return 0
  kill -KILL "${WATCHER_PIDS[@]}" 2>/dev/null || true
  wait "${WATCHER_PIDS[@]}" 2>/dev/null || true
  WATCHER_PIDS=()
}
stop_and_clean_on_exit "$WORK"
# Stop the watchers first, then the servers, keeping the script's exit status.
trap 'status=$?; stop_watchers; (exit $status); _clean_on_exit' EXIT

ENDPOINTS=$(cluster_endpoints "$PORT")
start_keel_cluster w "$KEEL" "$PORT" "$WORK"
wait_for_put "$BENCH" keel "$ENDPOINTS" "$READY_TIMEOUT_S" ||
  { echo "the cluster did not become ready" >&2; exit 1; }

# start_watchers MODE: WATCHERS `keel watch` processes of the whole keyspace, from now on.
start_watchers() {
  local i
  for i in $(seq 1 "$WATCHERS"); do
    case $1 in
      read) "$KEEL" --endpoints "$ENDPOINTS" watch '' --prefix >/dev/null 2>>"$WORK/watchers.log" & ;;
      # A FIFO opened for reading and writing by a sleeper that never reads it.
      stalled)
        mkfifo "$WORK/fifo-$i"
        sleep 3600 <>"$WORK/fifo-$i" &
        WATCHER_PIDS+=($!)
        "$KEEL" --endpoints "$ENDPOINTS" watch '' --prefix >"$WORK/fifo-$i" 2>>"$WORK/watchers.log" & ;;
    esac
    WATCHER_PIDS+=($!)
  done
  sleep 1
}

IFS=: read -r op clients <<<"$CASE"
modes=(none read stalled)
for repeat in $(seq 1 "$REPEATS"); do
  for k in 0 1 2; do
    mode=${modes[$(((repeat + k) % 3))]}
    [ "$mode" = none ] || start_watchers "$mode"
    line=$("$BENCH" --target keel --endpoints "$ENDPOINTS" --op "$op" --clients "$clients" \
      --connections $((clients < CONNECTIONS_MAX ? clients : CONNECTIONS_MAX)) \
      --duration "$DURATION" --warmup 1s --value-bytes 256 --keyspace 10000 --seed "$repeat" |
      tail -n 1)
    echo "repeat $repeat watchers-$mode $op-$clients: $line"
    stop_watchers
    rm -f "$WORK"/fifo-*
  done
done
