#!/usr/bin/env bash
# Spurious elections under load (issue 25): a 3-node Keel with every default on takes puts
# from 64 keel-bench clients for DURATION, and the nodes' logs are searched for elections a
# follower started because it stopped hearing its leader (openraft's "election timeout
# expired"). Nothing fails and nothing is paused, so every such election is spurious: the
# heartbeats came too late on a loaded machine. Leader transfers (the rebalancer, load
# splits) and the first election of a range created by a split are not election timeouts
# and are counted apart ("becomes leader" lines).
#
#   bench/elections.sh                         # 10 minutes, routed through keel-client
#   DURATION=120s ROUTE=spread bench/elections.sh
#   env: DURATION (600s), CLIENTS (64), ROUTE (leader or spread), KEEL, BENCH,
#        KEEL_SKIP_BUILD
# Exits 1 when a spurious election happened or the bench failed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
DURATION=${DURATION:-600s} CLIENTS=${CLIENTS:-64} ROUTE=${ROUTE:-leader}
KEEL=${KEEL:-$ROOT/target/release/keel} BENCH=${BENCH:-$ROOT/target/release/keel-bench}
BASE=27900 READY_TIMEOUT_S=90 STOP_TIMEOUT_S=10
WORK=$(mktemp -d "${TMPDIR:-/tmp}/keel-elections.XXXXXX")
SERVER_PIDS=()
declare -A SERVER_NAME=()

stop_and_clean_on_exit "$WORK"

if [ -z "${KEEL_SKIP_BUILD:-}" ]; then
  (cd "$ROOT" && cargo build --release -p keel-cli -p keel-bench)
fi
start_keel_cluster elections "$KEEL" "$BASE" "$WORK"
EP=$(cluster_endpoints "$BASE")
wait_for_put "$BENCH" keel "$EP" "$READY_TIMEOUT_S" || { echo "the cluster did not become ready" >&2; exit 1; }

count() { # pattern: matching lines in every node's log
  cat "$WORK"/elections-*.log | grep -c "$1" || true
}
timeouts_before=$(count "election timeout expired")
leaders_before=$(count "becomes leader")
echo "put, $CLIENTS clients, route $ROUTE, $DURATION; logs in $WORK"
status=0
"$BENCH" --target keel --route "$ROUTE" --endpoints "$EP" --op put --clients "$CLIENTS" \
  --connections 8 --duration "$DURATION" --warmup 3s || status=1
timeouts=$(($(count "election timeout expired") - timeouts_before))
leaders=$(($(count "becomes leader") - leaders_before))
echo "elections started by a follower's election timeout during the run: $timeouts"
echo "replicas that became leader during the run (transfers and new ranges included): $leaders"
echo "ranges at the end:"
"$KEEL" cluster ranges --endpoints "$EP"
if [ "$timeouts" -ne 0 ]; then
  echo "spurious elections:" >&2
  grep -h "election timeout expired" "$WORK"/elections-*.log | tail -n "$timeouts" >&2
  status=1
fi
exit $status
