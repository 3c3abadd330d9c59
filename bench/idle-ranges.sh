#!/usr/bin/env bash
# What N idle ranges cost: starts a 3-node release cluster on loopback (data in a temp dir,
# every default), splits the keyspace into N ranges, waits until nothing happens any more,
# then samples each server's CPU time (utime + stime from /proc/PID/stat) over a window and
# its memory (VmRSS, VmHWM from /proc/PID/status). Prints one line per node: % of one core,
# MiB resident, MiB peak, and how many of its replicas report themselves quiesced.
#
# "Nothing happens any more": after the splits, the rebalancer spreads the leaders (every
# child starts led by its parent's leader; it moves a few per second), so the script waits
# until no server has logged a rebalancing action for IDLE_WAIT_S seconds (at most
# SETTLE_MAX_S in all), then samples.
#
#   bench/idle-ranges.sh                    # N=1000, 15 s quiet to settle, 30 s sample
#   N=200 SAMPLE_S=60 bench/idle-ranges.sh
#   KEEL=/path/to/other/keel BUILD=0 bench/idle-ranges.sh   # measure another build
#   SERVE_ARGS="--consistency-check-interval-ms 60000" bench/idle-ranges.sh
#
# SERVE_ARGS (default empty): words appended to every node's `keel serve` (split on
# whitespace, no quoting), e.g. to measure a setting other than the default; the result's
# header line names them.
#
# Splits are issued as `keel cluster split --at KEY`, PARALLEL at a time: split points go
# level by level (the middle first, then the middles of both halves, ...), so the splits
# running at once are of different ranges. Every server is stopped at the end, whatever
# happens.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
N=${N:-1000} IDLE_WAIT_S=${IDLE_WAIT_S:-15} SAMPLE_S=${SAMPLE_S:-30} SETTLE_MAX_S=${SETTLE_MAX_S:-600}
PARALLEL=${PARALLEL:-4} PORT_BASE=${PORT_BASE:-7600} BUILD=${BUILD:-1}
SERVE_ARGS=${SERVE_ARGS:-}
read -r -a SERVE_ARGV <<<"$SERVE_ARGS"
READY_TIMEOUT_S=60 STOP_TIMEOUT_S=10
KEEL=${KEEL:-${CARGO_TARGET_DIR:-$ROOT/target}/release/keel}
SERVER_PIDS=()
declare -A SERVER_NAME=()
WORK=$(mktemp -d /tmp/keel-idle-ranges.XXXXXX)

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

cleanup() {
  trap - EXIT INT TERM
  stop_servers "$STOP_TIMEOUT_S" "${SERVER_PIDS[@]}"
  log "servers stopped; logs are in $WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ENDPOINTS=$(cluster_endpoints "$PORT_BASE")

start_cluster() {
  start_keel_cluster n "$KEEL" "$PORT_BASE" "$WORK" "${SERVE_ARGV[@]}"
}

wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  until "$KEEL" put bench-ready 1 --endpoints "$ENDPOINTS" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { log "the cluster did not become ready; logs in $WORK"; exit 1; }
    sleep 0.5
  done
}

# Split points k000001 .. k(N-1), one level per line, each level's points splitting distinct
# ranges.
split_levels() {
  python3 - "$N" <<'EOF'
import sys
n = int(sys.argv[1])
level = [(1, n - 1)]
while level:
    points, below = [], []
    for lo, hi in level:
        if lo > hi:
            continue
        mid = (lo + hi) // 2
        points.append(f"k{mid:06d}")
        below += [(lo, mid - 1), (mid + 1, hi)]
    if points:
        print(" ".join(points))
    level = below
EOF
}

split_all() {
  local start=$SECONDS failed=0 level
  while read -r level; do
    # shellcheck disable=SC2086
    printf '%s\n' $level | xargs -P "$PARALLEL" -I{} sh -c \
      '"$0" cluster split --at "$1" --endpoints "$2" >/dev/null 2>>"$3" || echo "split at $1 failed" >>"$3"' \
      "$KEEL" {} "$ENDPOINTS" "$WORK/splits.err" || true
  done < <(split_levels)
  [ ! -s "$WORK/splits.err" ] || failed=$(grep -c 'failed$' "$WORK/splits.err" || true)
  local ranges
  ranges=$("$KEEL" cluster ranges --output json --endpoints "$ENDPOINTS" 2>/dev/null |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin)))' 2>/dev/null) || ranges="?"
  log "$((N - 1)) splits in $((SECONDS - start)) s ($failed failed); the cluster has $ranges data ranges"
}

# Waits until no server logged a rebalancing action for IDLE_WAIT_S seconds.
settle() {
  local start=$SECONDS last=-1 count quiet_since=$SECONDS
  while :; do
    count=$(cat "$WORK"/n-[123].log | grep -c 'rebalancing action' || true)
    if [ "$count" != "$last" ]; then last=$count; quiet_since=$SECONDS; fi
    [ $((SECONDS - quiet_since)) -lt "$IDLE_WAIT_S" ] || break
    if [ $((SECONDS - start)) -ge "$SETTLE_MAX_S" ]; then
      log "still rebalancing after ${SETTLE_MAX_S} s; sampling anyway"
      break
    fi
    sleep 1
  done
  log "settled after $((SECONDS - start)) s ($last rebalancing actions in all)"
}

cpu_ticks() { # pid
  awk '{print $14 + $15}' "/proc/$1/stat"
}

mem_kib() { # pid, field
  awk -v field="$2:" '$1 == field {print $2}' "/proc/$1/status"
}

# Replicas node $1 reports quiesced, of all it hosts ("-" when the build reports nothing).
quiesced() {
  "$KEEL" cluster status --ranges --output json --endpoints "127.0.0.1:$((PORT_BASE + $1))" 2>/dev/null |
    python3 -c '
import json, sys
ranges = [r for node in json.load(sys.stdin) for r in node.get("ranges", [])]
reported = ranges and all("quiesced" in r for r in ranges)
count = sum(1 for r in ranges if r.get("quiesced")) if reported else "-"
print(f"{count}/{len(ranges)}")' 2>/dev/null || echo "?"
}

sample() {
  local hz i t0=() t1=()
  hz=$(getconf CLK_TCK)
  for i in 0 1 2; do t0[i]=$(cpu_ticks "${SERVER_PIDS[i]}"); done
  local started=$SECONDS
  sleep "$SAMPLE_S"
  local elapsed=$((SECONDS - started))
  for i in 0 1 2; do t1[i]=$(cpu_ticks "${SERVER_PIDS[i]}"); done
  echo "N=$N ranges, CPU over ${elapsed} s after ${IDLE_WAIT_S} s without rebalancing ($KEEL, SERVE_ARGS: ${SERVE_ARGS:-none})"
  printf '%-5s %-8s %12s %10s %10s %10s\n' node pid "cpu%(core)" "rss_MiB" "hwm_MiB" quiesced
  for i in 0 1 2; do
    local pid=${SERVER_PIDS[i]}
    local cpu
    cpu=$(awk -v d=$((t1[i] - t0[i])) -v hz="$hz" -v s="$elapsed" 'BEGIN {printf "%.1f", 100 * d / hz / s}')
    printf '%-5s %-8s %12s %10s %10s %10s\n' $((i + 1)) "$pid" "$cpu" \
      $(( $(mem_kib "$pid" VmRSS) / 1024 )) $(( $(mem_kib "$pid" VmHWM) / 1024 )) "$(quiesced $((i + 1)))"
  done
}

if [ "$BUILD" = 1 ]; then
  log "building release keel"
  (cd "$ROOT" && cargo build --release -q -p keel-cli)
fi
log "starting 3 nodes from $KEEL${SERVE_ARGS:+ with $SERVE_ARGS}, data in $WORK"
start_cluster
wait_ready
split_all
log "waiting until nothing was rebalanced for ${IDLE_WAIT_S} s"
settle
for pid in "${SERVER_PIDS[@]}"; do
  kill -0 "$pid" 2>/dev/null || { log "server $pid exited; logs in $WORK"; exit 1; }
done
log "sampling for ${SAMPLE_S} s"
sample
