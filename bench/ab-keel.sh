#!/usr/bin/env bash
# Two Keel builds side by side: a 3-node cluster of each binary on loopback (data in one temp
# dir, same disk), both up for the whole run, the same keel-bench cases on both, alternating
# which goes first and repeating. Prints one line per run; compare A and B within a repeat
# (fsync speed swings about tenfold over minutes here). Every server is stopped at the end.
#
#   bench/ab-keel.sh OLD_KEEL NEW_KEEL
#   env: CASES="put:1 put:16 put:64 lock-contended:16" (op:clients[:route], route leader
#        (the default) or spread), REPEATS=3, DURATION=8s, BENCH=target/release/keel-bench
#
# Build the two binaries first, e.g. `cargo build --release -p keel-cli -p keel-bench` at each
# commit and copy target/release/keel aside.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
[ $# -eq 2 ] || { sed -n '2,12p' "$0"; exit 2; }
A=$1 B=$2
for bin in "$A" "$B"; do
  [ -x "$bin" ] || { echo "ab-keel.sh: $bin is not an executable" >&2; exit 2; }
done
BENCH=${BENCH:-$ROOT/target/release/keel-bench}
CASES=${CASES:-"put:1 put:16 put:64 lock-contended:16"}
REPEATS=${REPEATS:-3} DURATION=${DURATION:-8s}
declare -A PORTS=([a]=27500 [b]=27600)
CONNECTIONS_MAX=8 READY_TIMEOUT_S=90 STOP_TIMEOUT_S=10
WORK=$(mktemp -d "${TMPDIR:-/tmp}/keel-ab.XXXXXX")
SERVER_PIDS=()
declare -A SERVER_NAME=()

stop_and_clean_on_exit "$WORK"

start_cluster() { # name, binary
  start_keel_cluster "$1" "$2" "${PORTS[$1]}" "$WORK"
  wait_for_put "$BENCH" keel "$(cluster_endpoints "${PORTS[$1]}")" "$READY_TIMEOUT_S" ||
    { echo "cluster $1 did not become ready" >&2; return 1; }
}

start_cluster a "$A"
start_cluster b "$B"
echo "a = $A; b = $B"
for repeat in $(seq 1 "$REPEATS"); do
  for entry in $CASES; do
    IFS=: read -r op clients route <<<"$entry"
    route=${route:-leader}
    order="a b"; [ $((repeat % 2)) -eq 0 ] && order="b a"
    for side in $order; do
      extra=(); case $op in lock*) extra=(--no-preload) ;; esac
      line=$("$BENCH" --target keel --endpoints "$(cluster_endpoints "${PORTS[$side]}")" --op "$op" \
        --route "$route" --clients "$clients" --connections $((clients < CONNECTIONS_MAX ? clients : CONNECTIONS_MAX)) \
        --duration "$DURATION" --warmup 1s --value-bytes 256 --keyspace 10000 --seed "$repeat" \
        "${extra[@]}" | tail -n 1)
      echo "repeat $repeat $side $op-$clients-$route: $line"
    done
  done
done
