#!/usr/bin/env bash
# Put throughput of Keel with the keyspace in 1 range versus split into N ranges (default 8),
# on two 3-node clusters running side by side on loopback, data in one temp dir (same disk,
# fsync on). The same keel-bench put cases run on both, alternating A/B and repeated, so the
# disk's swings hit both alike. Prints one line per run and the median per case.
#
#   bench/ranges.sh                 # 3 repeats, 10 s per run, 16 and 64 clients, 8 ranges
#   REPEATS=5 RANGES=4 bench/ranges.sh
#
# Every server is stopped at the end, whatever happens.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
REPEATS=${REPEATS:-3} DURATION=${DURATION:-10s} WARMUP=${WARMUP:-2s}
RANGES=${RANGES:-8} CLIENTS=${CLIENTS:-"16 64"}
VALUE_BYTES=256 KEYSPACE=10000 READY_TIMEOUT_S=60 STOP_TIMEOUT_S=10 SPREAD_TIMEOUT_S=60
declare -A PORT_BASE=([one]=7400 [many]=7500) CLUSTER_PIDS=()
SERVER_PIDS=() BENCH_PID=
declare -A SERVER_NAME=()
WORK=$(mktemp -d /tmp/keel-ranges-bench.XXXXXX)

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

cleanup() {
  trap - EXIT INT TERM
  [ -z "$BENCH_PID" ] || kill "$BENCH_PID" 2>/dev/null || true
  stop_servers "$STOP_TIMEOUT_S" "${SERVER_PIDS[@]}"
  log "servers stopped; logs and runs are in $WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

endpoints() { # cluster
  cluster_endpoints "${PORT_BASE[$1]}"
}

# Splits happen by command only: the "many" cluster is split into $RANGES by split_many.
start_cluster() { # cluster
  start_keel_cluster "$1" "$KEEL" "${PORT_BASE[$1]}" "$WORK"
  CLUSTER_PIDS[$1]="${SERVER_PIDS[*]: -3}"
}

wait_ready() { # cluster
  wait_for_put "$BENCH" keel "$(endpoints "$1")" "$READY_TIMEOUT_S" ||
    { log "$1 did not become ready; logs in $WORK"; exit 1; }
}

# Splits the "many" cluster's keyspace into $RANGES ranges of equal shares of the bench keys,
# then waits (at most $SPREAD_TIMEOUT_S) until the rebalancer has spread their leaders over
# the 3 nodes (counts within one of each other).
split_many() {
  local i at deadline=$((SECONDS + SPREAD_TIMEOUT_S))
  for i in $(seq 1 $((RANGES - 1))); do
    at=$(printf 'bench-%07d' $((KEYSPACE * i / RANGES)))
    "$KEEL" cluster split --at "$at" --endpoints "$(endpoints many)" >/dev/null
  done
  until "$KEEL" cluster ranges --output json --endpoints "$(endpoints many)" 2>/dev/null |
      python3 -c 'import collections,json,sys; n=collections.Counter(r["leader"] for r in json.load(sys.stdin)); sys.exit(0 if None not in n and len(n) == 3 and max(n.values()) - min(n.values()) <= 1 else 1)'; do
    [ $SECONDS -lt $deadline ] || { log "leaders did not spread in ${SPREAD_TIMEOUT_S}s"; break; }
    sleep 1
  done
  "$KEEL" cluster ranges --endpoints "$(endpoints many)" >&2
  "$KEEL" cluster status --endpoints "$(endpoints many)" >&2
}

# CPU time (user + system) of a cluster's three servers so far, in clock ticks.
cpu_ticks() { # cluster
  local pid total=0
  for pid in ${CLUSTER_PIDS[$1]}; do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
  done
  echo "$total"
}

# Prints the run's ops/s and the servers' CPU per put in µs (over warm-up and run, so it
# assumes the warm-up ran at the measured rate).
run() { # cluster, clients, repeat
  local out="$WORK/put-$2.$1.$3.json" ticks_before
  ticks_before=$(cpu_ticks "$1")
  "$BENCH" --target keel --endpoints "$(endpoints "$1")" --op put --clients "$2" \
    --connections "$(( $2 < 16 ? $2 : 16 ))" --duration "$DURATION" --warmup "$WARMUP" \
    --value-bytes "$VALUE_BYTES" --keyspace "$KEYSPACE" --seed "$3" --json "$out" \
    >>"$WORK/runs.log" 2>&1 &
  BENCH_PID=$!
  wait "$BENCH_PID" || log "put-$2 on $1 failed (see $WORK/runs.log)"
  BENCH_PID=
  python3 - "$out" $(($(cpu_ticks "$1") - ticks_before)) "$(getconf CLK_TCK)" "$DURATION" "$WARMUP" <<'EOF'
import json, sys
out, ticks, hz, run, warm = sys.argv[1:]
secs = lambda d: float(d[:-2]) / 1000 if d.endswith("ms") else float(d[:-1])
ops = json.load(open(out))["ops_per_sec"]
print(round(ops), round(int(ticks) / int(hz) * 1e6 / (ops * (secs(run) + secs(warm)))))
EOF
}

log "building release keel and keel-bench"
(cd "$ROOT" && cargo build --release -q -p keel-cli -p keel-bench)
KEEL=${KEEL:-${CARGO_TARGET_DIR:-$ROOT/target}/release/keel}
BENCH=${CARGO_TARGET_DIR:-$ROOT/target}/release/keel-bench
start_cluster one
start_cluster many
wait_ready one
wait_ready many
split_many
declare -A SEEN=() CPU=()
for repeat in $(seq 1 "$REPEATS"); do
  for clients in $CLIENTS; do
    # Alternate which cluster goes first, so neither always runs on the warmer disk.
    order="one many"; [ $((repeat % 2)) -eq 0 ] && order="many one"
    for cluster in $order; do
      read -r ops cpu < <(run "$cluster" "$clients" "$repeat")
      log "repeat $repeat put-$clients $cluster: $ops ops/s, $cpu µs server CPU per put"
      SEEN[$clients.$cluster]+="$ops " CPU[$clients.$cluster]+="$cpu "
    done
  done
done
echo "case      1 range (ops/s, runs)       $RANGES ranges (ops/s, runs)     ratio   CPU µs/put (1, $RANGES)"
for clients in $CLIENTS; do
  python3 - "$clients" "${SEEN[$clients.one]}" "${SEEN[$clients.many]}" \
      "${CPU[$clients.one]}" "${CPU[$clients.many]}" <<'EOF'
import statistics, sys
ints = lambda s: [int(x) for x in s.split()]
clients, one, many, cpu1, cpu8 = sys.argv[1], *map(ints, sys.argv[2:])
m1, m8 = statistics.median(one), statistics.median(many)
c1, c8 = statistics.median(cpu1), statistics.median(cpu8)
print(f"put-{clients:<5} {m1:>8.0f} {one!s:<22} {m8:>8.0f} {many!s:<22} {m8 / m1:.2f}x   {c1:.0f}, {c8:.0f}")
EOF
done
