#!/usr/bin/env bash
# What a leadership move costs callers: a 3-node Keel with every default on, load from
# keel-bench in both client modes (`--route leader` through keel-client, `--route spread` as
# raw gRPC calls round robin over the nodes), while keel-bench hands every data range's
# leadership to its next voter every MOVE_EVERY (`--move-leader-every`). Each case prints the
# bench line and a second table: the operations that completed within 1 s of a round of moves
# against the rest of the run (ops, errors by code, p50/p99/max latency). The cases alternate
# between the two routes, on one cluster, so they see the same disk.
#
#   bench/leader-moves.sh                       # 30 s per case, a move round every 3 s
#   DURATION=60s MOVE_EVERY=5s bench/leader-moves.sh
#   env: DURATION, MOVE_EVERY, CASES ("put:16 get-linearizable:64 mixed:64"), KEEL, BENCH,
#        OUT (JSON per case; default a temp dir), KEEL_SKIP_BUILD
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
DURATION=${DURATION:-30s} MOVE_EVERY=${MOVE_EVERY:-3s}
CASES=${CASES:-put:16 get-linearizable:64 mixed:64}
KEEL=${KEEL:-$ROOT/target/release/keel} BENCH=${BENCH:-$ROOT/target/release/keel-bench}
BASE=27800 READY_TIMEOUT_S=90 STOP_TIMEOUT_S=10
WORK=$(mktemp -d "${TMPDIR:-/tmp}/keel-leader-moves.XXXXXX")
OUT=${OUT:-$WORK/results}
mkdir -p "$OUT"
SERVER_PIDS=()
declare -A SERVER_NAME=()

stop_and_clean_on_exit "$WORK"

if [ -z "${KEEL_SKIP_BUILD:-}" ]; then
  (cd "$ROOT" && cargo build --release -p keel-cli -p keel-bench)
fi
start_keel_cluster moves "$KEEL" "$BASE" "$WORK"
EP=$(cluster_endpoints "$BASE")
wait_for_put "$BENCH" keel "$EP" "$READY_TIMEOUT_S" || { echo "the cluster did not become ready" >&2; exit 1; }
echo "leader moves every $MOVE_EVERY, $DURATION per case; results in $OUT"
status=0
for case in $CASES; do
  op=${case%%:*} clients=${case##*:}
  for route in leader spread; do
    echo "== $op, $clients clients, route $route"
    "$BENCH" --target keel --route "$route" --endpoints "$EP" --op "$op" \
      --clients "$clients" --connections 8 --duration "$DURATION" --warmup 3s \
      --move-leader-every "$MOVE_EVERY" --json "$OUT/$op-$clients-$route.json" || status=1
  done
done
echo "ranges at the end:"
"$KEEL" cluster ranges --endpoints "$EP"
exit $status
