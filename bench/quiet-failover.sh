#!/usr/bin/env bash
# Fail-over of an idle range (issue 25): bench/failover.sh keeps its range busy, so its range
# never quiesces. Here a 3-node cluster (every default on) holds one data range that nobody
# uses; each round waits until every replica of it reports itself quiesced, then kills
# (kill -9) or pauses (SIGSTOP) the node leading it, and times one `keel put` to the range
# (keel-client, retries included, 15 s budget) from the fault until it is answered. Then the
# node comes back (restart or SIGCONT) and the next round waits until the cluster is whole
# and the range quiet again. Prints, per fault kind, every time and their p50 / max, in
# seconds; a put that failed counts as an error and is left out of the times.
#
#   bench/quiet-failover.sh                      # 5 kills and 5 pauses, alternating
#   ROUNDS=4 KEEL=/path/to/keel bench/quiet-failover.sh
#   env: ROUNDS (10), KEEL (target/release/keel), PORT_BASE (27700), KEEL_SKIP_BUILD
# Exits 1 when a round could not be set up or a put failed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
ROUNDS=${ROUNDS:-10} PORT_BASE=${PORT_BASE:-27700}
KEEL=${KEEL:-${CARGO_TARGET_DIR:-$ROOT/target}/release/keel}
READY_TIMEOUT_S=60 QUIET_TIMEOUT_S=60 STOP_TIMEOUT_S=10 PUT_BUDGET_MS=15000
WORK=$(mktemp -d "${TMPDIR:-/tmp}/keel-quiet-failover.XXXXXX")
SERVER_PIDS=()
declare -A SERVER_NAME=()
declare -A PID_OF=()

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for pid in "${PID_OF[@]}"; do kill -CONT "$pid" 2>/dev/null || true; done
  stop_and_clean $status "$WORK"
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -z "${KEEL_SKIP_BUILD:-}" ]; then
  (cd "$ROOT" && cargo build --release -p keel-cli)
fi
EP=$(cluster_endpoints "$PORT_BASE")
CLUSTER="1=127.0.0.1:$((PORT_BASE + 1)),2=127.0.0.1:$((PORT_BASE + 2)),3=127.0.0.1:$((PORT_BASE + 3))"

# start_node I: node I as start_keel_cluster starts it (every default on), appending its log.
start_node() {
  "$KEEL" serve --node-id "$1" --listen "127.0.0.1:$((PORT_BASE + $1))" \
    --data-dir "$WORK/n-$1" --initial-cluster "$CLUSTER" >>"$WORK/n-$1.log" 2>&1 &
  PID_OF[$1]=$!
  SERVER_PIDS+=($!)
  SERVER_NAME[$!]=n-$1
}

keel() { "$KEEL" --endpoints "$EP" "$@"; }

# The leader of the data range once every node reports it quiesced under one leader (empty
# while not).
quiet_leader() {
  keel --output json --timeout-ms 2000 cluster status --ranges 2>/dev/null | python3 -c '
import json, sys
views = json.load(sys.stdin)
leaders = set()
for view in views:
    data = [r for r in view.get("ranges", []) if r["range_id"] != 0]
    if len(data) != 1 or not data[0]["quiesced"] or data[0]["leader"] is None:
        sys.exit(0)
    leaders.add(data[0]["leader"])
if len(views) == 3 and len(leaders) == 1:
    print(leaders.pop())
' || true
}

for i in 1 2 3; do start_node "$i"; done
deadline=$((SECONDS + READY_TIMEOUT_S))
until keel --timeout-ms 2000 put quiet/k ready >/dev/null 2>&1; do
  [ $SECONDS -lt $deadline ] || { echo "the cluster did not become ready" >&2; exit 1; }
  sleep 0.5
done

errors=0
declare -A TIMES=()
for round in $(seq 1 "$ROUNDS"); do
  fault=kill
  [ $((round % 2)) -eq 0 ] && fault=pause
  deadline=$((SECONDS + QUIET_TIMEOUT_S))
  leader=$(quiet_leader)
  while [ -z "$leader" ]; do
    [ $SECONDS -lt $deadline ] || { echo "round $round: the range did not quiesce" >&2; exit 1; }
    sleep 0.2
    leader=$(quiet_leader)
  done
  pid=${PID_OF[$leader]}
  if [ "$fault" = kill ]; then kill -KILL "$pid"; wait "$pid" 2>/dev/null || true; else kill -STOP "$pid"; fi
  start=$(date +%s%N)
  if keel --timeout-ms "$PUT_BUDGET_MS" put quiet/k "round-$round" >/dev/null 2>"$WORK/put.err"; then
    took=$(awk -v ns=$(($(date +%s%N) - start)) 'BEGIN { printf "%.3f", ns / 1e9 }')
    TIMES[$fault]+=" $took"
    echo "round $round: $fault of node $leader (the quiet range's leader): put answered after $took s"
  else
    errors=$((errors + 1))
    echo "round $round: $fault of node $leader: put failed: $(tr '\n' ' ' <"$WORK/put.err")"
  fi
  if [ "$fault" = kill ]; then start_node "$leader"; else kill -CONT "$pid"; fi
  # Whole again: every node answers, before the next round waits for quiet.
  deadline=$((SECONDS + READY_TIMEOUT_S))
  until [ "$(keel --output json --timeout-ms 2000 cluster status --ranges 2>/dev/null |
      python3 -c 'import json, sys; print(sum(1 for view in json.load(sys.stdin) if view.get("healthy")))' \
        2>/dev/null)" = 3 ]; do
    [ $SECONDS -lt $deadline ] || { echo "round $round: node $leader did not come back" >&2; exit 1; }
    sleep 0.2
  done
done

echo "quiet-failover: $ROUNDS rounds on $("$KEEL" --version), seconds from the fault to the put's answer"
for fault in kill pause; do
  [ -n "${TIMES[$fault]:-}" ] || continue
  echo "${TIMES[$fault]}" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk -v f="$fault" '
    { t[NR] = $1 } END { printf "%-6s n=%d p50 %.2f max %.2f  (", f, NR, t[int((NR + 1) / 2)], t[NR];
      for (i = 1; i <= NR; i++) printf "%s%.2f", (i > 1 ? " " : ""), t[i]; print ")" }'
done
echo "errors: $errors"
[ "$errors" -eq 0 ]
