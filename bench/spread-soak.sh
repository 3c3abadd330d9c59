#!/usr/bin/env bash
# A long run of spread clients against a 3-node Keel with every default on (the rebalancer,
# load splits): keel-bench `--route spread` sends linearizable gets and puts round robin over
# the nodes as raw gRPC calls, without keel-client's routing or retries, as generic clients
# and load balancers do. Prints the bench line (errors by code) and the range table before
# and after (load splits, leaders and terms). Exits 1 when any call failed.
#
#   bench/spread-soak.sh                    # 10 minutes, 64 clients, half reads
#   DURATION=2m CLIENTS=16 bench/spread-soak.sh
#   env: DURATION, CLIENTS, CONNECTIONS (8), READ_RATIO (0.5), KEEL, BENCH
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
DURATION=${DURATION:-10m} CLIENTS=${CLIENTS:-64} CONNECTIONS=${CONNECTIONS:-8}
READ_RATIO=${READ_RATIO:-0.5}
KEEL=${KEEL:-$ROOT/target/release/keel} BENCH=${BENCH:-$ROOT/target/release/keel-bench}
BASE=27700 READY_TIMEOUT_S=90 STOP_TIMEOUT_S=10
WORK=$(mktemp -d "${TMPDIR:-/tmp}/keel-spread-soak.XXXXXX")
SERVER_PIDS=()
declare -A SERVER_NAME=()

stop_and_clean_on_exit "$WORK"

if [ -z "${KEEL_SKIP_BUILD:-}" ]; then
  (cd "$ROOT" && cargo build --release -p keel-cli -p keel-bench)
fi
start_keel_cluster soak "$KEEL" "$BASE" "$WORK"
EP=$(cluster_endpoints "$BASE")
wait_for_put "$BENCH" keel "$EP" "$READY_TIMEOUT_S" || { echo "the cluster did not become ready" >&2; exit 1; }
echo "ranges at the start:"
"$KEEL" cluster ranges --endpoints "$EP"
echo "spread soak: $DURATION, $CLIENTS clients over $CONNECTIONS connection sets, read ratio $READ_RATIO"
status=0
"$BENCH" --target keel --route spread --endpoints "$EP" --op mixed --read-ratio "$READ_RATIO" \
  --clients "$CLIENTS" --connections "$CONNECTIONS" --duration "$DURATION" --warmup 5s \
  --value-bytes 256 --keyspace 10000 --json "$WORK/soak.json" || status=1
echo "ranges at the end:"
"$KEEL" cluster ranges --endpoints "$EP"
exit $status
