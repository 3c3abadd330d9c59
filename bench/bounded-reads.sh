#!/usr/bin/env bash
# What a staleness bound costs a follower read: one 3-node release cluster on loopback (every
# default, data in a temp dir), 64 clients of keel-bench in both client modes, reads of four
# kinds interleaved in each repeat: linearizable, follower within 100 ms, follower within 0 ms
# (always catches up first) and follower without a bound. Prints one keel-bench line per run
# (ops/s in the 12th column, errors in the 11th). Every server is stopped at the end.
#
#   bench/bounded-reads.sh
#   env: REPEATS=3, DURATION=8s, CLIENTS=64, KEEL=target/release/keel, BENCH=target/release/keel-bench
#
# Build first: `cargo build --release -p keel-cli -p keel-bench`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
KEEL=${KEEL:-$ROOT/target/release/keel} BENCH=${BENCH:-$ROOT/target/release/keel-bench}
REPEATS=${REPEATS:-3} DURATION=${DURATION:-8s} CLIENTS=${CLIENTS:-64}
PORT=27700 CONNECTIONS=8 READY_TIMEOUT_S=90 STOP_TIMEOUT_S=10
WORK=$(mktemp -d "${TMPDIR:-/tmp}/keel-bounded.XXXXXX")
SERVER_PIDS=()
declare -A SERVER_NAME=()

stop_and_clean_on_exit "$WORK"

start_keel_cluster bounded "$KEEL" "$PORT" "$WORK"
endpoints=$(cluster_endpoints "$PORT")
wait_for_put "$BENCH" keel "$endpoints" "$READY_TIMEOUT_S" ||
  { echo "the cluster did not become ready" >&2; exit 1; }
reads=("get-linearizable" "get-follower --max-staleness 100ms" "get-follower --max-staleness 0ms" "get-follower")
for repeat in $(seq 1 "$REPEATS"); do
  for route in leader spread; do
    for read in "${reads[@]}"; do
      # shellcheck disable=SC2086 # the read is an op and its flags
      line=$("$BENCH" --target keel --endpoints "$endpoints" --op $read --route "$route" \
        --clients "$CLIENTS" --connections "$CONNECTIONS" --duration "$DURATION" --warmup 1s \
        --value-bytes 256 --keyspace 10000 --seed "$repeat" | tail -n 1)
      echo "repeat $repeat $route ${read// /_}: $line"
    done
  done
done
