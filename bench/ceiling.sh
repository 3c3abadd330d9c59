#!/usr/bin/env bash
# What the disk costs each system, in one run: four 3-node clusters on loopback, etcd and
# Keel each with data on the repo's disk (fsync on, as in compare-etcd.sh) and on tmpfs
# (/dev/shm: an fsync there returns at once, so what is left is CPU, scheduling and network
# hops), the same keel-bench put cases on all four, rotating which goes first, repeated.
# Prints every run, then per case the median ops/s and p50 of each setup and its ratio to
# etcd on disk. Keel on tmpfs bounds what any change of Keel's storage alone could reach
# against etcd on disk. Every server is stopped at the end.
#
#   bench/ceiling.sh
#   env: CASES="put:1 put:16 put:64" (op:clients), REPEATS=3, DURATION=8s,
#        KEEL=target/release/keel, BENCH=target/release/keel-bench (built with --features etcd)
#
# Needs etcd on PATH (bench/compare-etcd.sh installs it) and about 100 MiB free in /dev/shm.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
KEEL=${KEEL:-$ROOT/target/release/keel} BENCH=${BENCH:-$ROOT/target/release/keel-bench}
CASES=${CASES:-"put:1 put:16 put:64"}
REPEATS=${REPEATS:-3} DURATION=${DURATION:-8s}
SETUPS=(etcd-disk keel-disk etcd-tmpfs keel-tmpfs)
declare -A PORTS=([etcd-disk]=28100 [keel-disk]=28200 [etcd-tmpfs]=28300 [keel-tmpfs]=28400)
PEER_PORT_OFFSET=50 CONNECTIONS_MAX=8 READY_TIMEOUT_S=90 STOP_TIMEOUT_S=10
for bin in "$KEEL" "$BENCH"; do
  [ -x "$bin" ] || { echo "ceiling.sh: $bin is not an executable (build release first)" >&2; exit 2; }
done
command -v etcd >/dev/null || { echo "ceiling.sh: etcd is not on PATH" >&2; exit 2; }
DISK=$(mktemp -d "${TMPDIR:-/tmp}/keel-ceiling.XXXXXX")
TMPFS=$(mktemp -d /dev/shm/keel-ceiling.XXXXXX)
SERVER_PIDS=()
declare -A SERVER_NAME=()

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  stop_and_clean $status "$DISK" "$TMPFS"
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for setup in "${SETUPS[@]}"; do
  system=${setup%%-*} port=${PORTS[$setup]} dir=$DISK
  [ "${setup#*-}" = tmpfs ] && dir=$TMPFS
  case $system in
    etcd) start_etcd_cluster "$setup" "$port" $((port + PEER_PORT_OFFSET)) "$dir" ;;
    keel) start_keel_cluster "$setup" "$KEEL" "$port" "$dir" ;;
  esac
done
for setup in "${SETUPS[@]}"; do
  wait_for_put "$BENCH" "${setup%%-*}" "$(cluster_endpoints "${PORTS[$setup]}")" "$READY_TIMEOUT_S" ||
    { echo "$setup did not become ready" >&2; exit 1; }
done
echo "fsync of 4 KiB on the disk before: $(fsync_probe_in "$DISK") µs"
RUNS=$DISK/runs.txt
turn=0
for repeat in $(seq 1 "$REPEATS"); do
  for entry in $CASES; do
    op=${entry%%:*} clients=${entry##*:}
    for k in 0 1 2 3; do
      setup=${SETUPS[$(((k + turn) % 4))]}
      line=$("$BENCH" --target "${setup%%-*}" --endpoints "$(cluster_endpoints "${PORTS[$setup]}")" \
        --op "$op" --clients "$clients" \
        --connections $((clients < CONNECTIONS_MAX ? clients : CONNECTIONS_MAX)) \
        --duration "$DURATION" --warmup 1s --value-bytes 256 --keyspace 10000 --seed "$repeat" |
        tail -n 1)
      echo "repeat $repeat $setup $op-$clients: $line"
      echo "$op-$clients $setup $line" >>"$RUNS"
    done
    turn=$((turn + 1))
  done
done
echo "fsync of 4 KiB on the disk after: $(fsync_probe_in "$DISK") µs"
# Per case and setup: median ops/s and p50 over the repeats, and each against etcd on disk.
python3 - "$RUNS" "${SETUPS[@]}" <<'EOF'
import statistics, sys
runs, setups = sys.argv[1], sys.argv[2:]
figures = {}
for line in open(runs):
    case, setup, *columns = line.split()
    # keel-bench's row: target route op clients conns ops errors ops/s p50 p99 p99.9 max codes
    figures.setdefault(case, {}).setdefault(setup, []).append((float(columns[7]), float(columns[8])))
print("\ncase      setup        ops/s (median)  vs etcd-disk   p50 µs (median)  vs etcd-disk")
for case, by_setup in figures.items():
    base = by_setup["etcd-disk"]
    base_ops = statistics.median(ops for ops, _ in base)
    base_p50 = statistics.median(p50 for _, p50 in base)
    for setup in setups:
        ops = statistics.median(ops for ops, _ in by_setup[setup])
        p50 = statistics.median(p50 for _, p50 in by_setup[setup])
        print(f"{case:<9} {setup:<12} {ops:>14.0f} {ops / base_ops:>12.2f}x {p50:>16.0f} {p50 / base_p50:>12.2f}x")
EOF
