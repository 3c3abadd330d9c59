#!/usr/bin/env bash
# Keel and etcd side by side on this machine: a 3-node etcd and a 3-node Keel on loopback,
# data in one temp dir (same disk, fsync on for both), the same keel-bench matrix on both,
# rotating which system goes first and repeating, then per-case ratios (Keel/etcd, the
# median of the repeats with the min–max spread), peak RSS per system, docs/BENCHMARKS.md and
# bench/results/ratios.svg. Every process it starts is stopped at the end, whatever happens.
#
# Keel runs every case in two modes, interleaved with etcd in the same repeat:
#   keel         keel-bench --route leader: keel-client sends each request to its range's
#                leader (and retries), as Keel's own client does;
#   keel-spread  keel-bench --route spread: raw gRPC calls round robin over the three nodes,
#                which forward to the leader; no retries, every non-OK answer is an error;
#                as other clients (generated gRPC clients, load balancers) reach Keel.
#   keel-etcd    keel-bench --target etcd against Keel's --etcd-listen ports: etcd's own load
#                generator (etcd-client) through Keel's etcd API (docs/ETCD.md); not the lock
#                cases, which need etcd's leases.
# etcd runs once: its own client already spreads requests over the endpoints.
# Columns of the results (printed and in docs/BENCHMARKS.md): ops/s of Keel, Keel spread and
# etcd; ops/s Keel/etcd and spread/etcd; p50 / p99 µs of each; p50 and p99 Keel/etcd;
# errors K / Ks / e (Keel, Keel spread, etcd, summed over the repeats); a table of the
# etcd-API runs. A second table gives
# the errors by code: upper case = the gRPC code of the answer (with Keel's error detail after
# `/`), lower case = keel-client's error after its retries, bench_timeout = no answer in 10 s.
# Run files: results/runs/<case>.<keel|keel-spread|keel-etcd|etcd>.<repeat>.json.
#
#   bench/compare-etcd.sh            # full: 3 repeats, 10 s measured + 2 s warm-up per run
#   bench/compare-etcd.sh --quick    # 1 repeat, 3 s + 1 s
#   options: --repeats N --duration D --warmup D --no-docs --keep
#
# Needs: cargo, python3, and etcd (installed from Debian's etcd-server when missing; root or
# sudo). protoc comes from the protoc-bin-vendored crate (bench/protoc-path.sh) unless PROTOC
# is set or protoc is on PATH.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
ARGS="$*"
REPEATS=3 DURATION=10s WARMUP=2s MODE=full WRITE_DOCS=1 KEEP=0
VALUE_BYTES=256 KEYSPACE=10000
# Seconds a cluster gets to elect a leader and answer.
READY_TIMEOUT_S=90
# Seconds a stopped server gets to exit after SIGTERM before SIGKILL.
STOP_TIMEOUT_S=10
# Client instances (connections) shared by the tasks of a run, at most.
CONNECTIONS_MAX=8
ETCD_CLIENT_PORT=23790 ETCD_PEER_PORT=23800 KEEL_PORT=27100 KEEL_ETCD_PORT=27200

# name|op|clients|systems (both, or the one system that has the operation; keel runs in every
# mode)
CASES=(
  "put-1|put|1|both"
  "put-16|put|16|both"
  "put-64|put|64|both"
  "get-linearizable-64|get-linearizable|64|both"
  "get-follower-64|get-follower|64|both"
  "lock-1|lock|1|both"
  "lock-16|lock|16|both"
  "lock-contended-16|lock-contended|16|both"
)

while [ $# -gt 0 ]; do
  case "$1" in
    --quick) MODE=quick REPEATS=1 DURATION=3s WARMUP=1s ;;
    --repeats) REPEATS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --no-docs) WRITE_DOCS=0 ;;
    --keep) KEEP=1 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "compare-etcd.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$REPEATS" in ''|*[!0-9]*|0) echo "compare-etcd.sh: --repeats must be 1 or more" >&2; exit 2 ;; esac

WORK=$(mktemp -d "${TMPDIR:-/tmp}/keel-vs-etcd.XXXXXX")
OUT=$WORK/results
mkdir -p "$OUT/runs" "$OUT/rss"
SERVER_PIDS=() HELPER_PIDS=() BENCH_PID=
declare -A SERVER_NAME=()

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# Stops what this script started, by pid: servers with SIGTERM then SIGKILL, then helpers.
cleanup() {
  local status=$? pid
  trap - EXIT INT TERM
  [ -z "$BENCH_PID" ] || kill "$BENCH_PID" 2>/dev/null || true
  for pid in "${HELPER_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  stop_servers "$STOP_TIMEOUT_S" "${SERVER_PIDS[@]}"
  for pid in "${HELPER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$KEEP" = 1 ] || [ $status -ne 0 ]; then
    log "kept $WORK (logs: $WORK/*.log)"
  else
    rm -rf "$WORK"
  fi
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

install_etcd() {
  command -v etcd >/dev/null && return
  log "installing etcd-server from Debian"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  # On a systemd host the package also starts a default etcd on 2379/2380; the ports here
  # differ, so it does not interfere.
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y etcd-server >/dev/null ||
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y etcd-server >/dev/null; }
}

build() {
  if [ -z "${PROTOC:-}" ]; then
    PROTOC=$(command -v protoc || "$ROOT/bench/protoc-path.sh")
  fi
  export PROTOC
  log "building release keel and keel-bench --features etcd"
  (cd "$ROOT" && cargo build --release -q -p keel-cli -p keel-bench --features keel-bench/etcd)
  local target_dir=${CARGO_TARGET_DIR:-$ROOT/target}
  KEEL=$target_dir/release/keel BENCH=$target_dir/release/keel-bench
}

start_clusters() {
  start_etcd_cluster etcd "$ETCD_CLIENT_PORT" "$ETCD_PEER_PORT" "$WORK"
  ETCD_LISTEN_BASE=$KEEL_ETCD_PORT start_keel_cluster keel "$KEEL" "$KEEL_PORT" "$WORK"
  declare -gA ENDPOINTS=([etcd]=$(cluster_endpoints "$ETCD_CLIENT_PORT")
    [keel]=$(cluster_endpoints "$KEEL_PORT") [keel-spread]=$(cluster_endpoints "$KEEL_PORT")
    [keel-etcd]=$(cluster_endpoints "$KEEL_ETCD_PORT"))
}

# Waits until a one-key put succeeds on `system`.
wait_ready() {
  local system=$1 target
  case "$system" in keel-etcd) target=etcd ;; *) target=$system ;; esac
  if ! wait_for_put "$BENCH" "$target" "${ENDPOINTS[$system]}" "$READY_TIMEOUT_S"; then
    log "$system did not become ready within ${READY_TIMEOUT_S}s; its logs are in $WORK"
    return 1
  fi
  log "$system is ready"
}

# Every second, the peak RSS (VmHWM) of every server into $OUT/rss/<name>, in kB.
sample_rss() {
  local pid hwm
  while true; do
    for pid in "${SERVER_PIDS[@]}"; do
      hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || continue
      [ -n "$hwm" ] && echo "$hwm" >"$OUT/rss/${SERVER_NAME[$pid]}"
    done
    sleep 1
  done
}

# The keel-bench flags of a system: its target, and for Keel its route.
target_flags() { # system
  case "$1" in
    keel) echo "--target keel --route leader" ;;
    keel-spread) echo "--target keel --route spread" ;;
    etcd|keel-etcd) echo "--target etcd" ;;
  esac
}

run_case() { # system, case name, op, clients, repeat
  local system=$1 name=$2 op=$3 clients=$4 repeat=$5 connections preload=() target
  connections=$((clients < CONNECTIONS_MAX ? clients : CONNECTIONS_MAX))
  case "$op" in lock*) preload=(--no-preload) ;; esac
  read -r -a target <<<"$(target_flags "$system")"
  # The system's own server processes, whose CPU time keel-bench adds up.
  local pid pids=()
  for pid in "${SERVER_PIDS[@]}"; do
    case "${SERVER_NAME[$pid]}" in "${system%%-*}"-*) pids+=("$pid") ;; esac
  done
  local command=("$BENCH" "${target[@]}" --endpoints "${ENDPOINTS[$system]}" --op "$op"
    --server-pids "$(IFS=,; echo "${pids[*]}")"
    --clients "$clients" --connections "$connections" --duration "$DURATION" --warmup "$WARMUP"
    --value-bytes "$VALUE_BYTES" --keyspace "$KEYSPACE" --seed "$repeat" "${preload[@]}"
    --json "$OUT/runs/$name.$system.$repeat.json")
  log "repeat $repeat: $name on $system"
  # In the background and waited for, so that a signal stops the script at once.
  "${command[@]}" >>"$OUT/runs.log" 2>&1 &
  BENCH_PID=$!
  if ! wait "$BENCH_PID"; then
    log "  $name on $system failed (see $OUT/runs.log)"
  fi
  BENCH_PID=
  tail -n 1 "$OUT/runs.log" >&2
}

run_matrix() {
  local repeat index entry name op clients systems order system
  log "Keel runs every case twice: keel (--route leader, keel-client to the leader) and" \
    "keel-spread (--route spread, round robin over the nodes, which forward); etcd runs once:" \
    "its own client already spreads requests over the endpoints"
  for repeat in $(seq 1 "$REPEATS"); do
    index=0
    for entry in "${CASES[@]}"; do
      IFS='|' read -r name op clients systems <<<"$entry"
      # The order rotates: no system always runs first, or right after the same case.
      case $(((repeat + index) % 4)) in
        0) order="keel keel-spread etcd keel-etcd" ;;
        1) order="keel-spread etcd keel-etcd keel" ;;
        2) order="etcd keel-etcd keel keel-spread" ;;
        *) order="keel-etcd keel keel-spread etcd" ;;
      esac
      for system in $order; do
        # keel-spread and keel-etcd run wherever keel does; keel-etcd not the lock cases.
        [ "$systems" = both ] || [ "$systems" = "${system%%-*}" ] || continue
        case "$system:$op" in keel-etcd:lock*) continue ;; esac
        run_case "$system" "$name" "$op" "$clients" "$repeat"
      done
      index=$((index + 1))
    done
  done
}

write_machine() {
  local disk
  disk=$(df -hT "$WORK" | awk 'NR == 2 {print $1 " (" $2 ", " $3 ")"}')
  python3 - "$OUT/machine.json" <<EOF
import json, sys
json.dump({
  "date_utc": "$(date -u '+%Y-%m-%d %H:%M UTC')",
  "started_utc": "$STARTED",
  "mode": "$MODE", "repeats": $REPEATS, "duration": "$DURATION", "warmup": "$WARMUP",
  "value_bytes": $VALUE_BYTES, "keyspace": $KEYSPACE, "connections_max": $CONNECTIONS_MAX,
  "systems": {"keel": "keel-bench --route leader", "keel-spread": "keel-bench --route spread", "etcd": "etcd-client (spreads over the endpoints by itself)", "keel-etcd": "etcd-client against Keel's --etcd-listen ports"},
  "nproc": $(nproc),
  "memory": "$(awk '/^MemTotal:/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)",
  "cpu": "$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)",
  "kernel": "$(uname -r)",
  "disk": "$disk",
  "fsync_us_before": $FSYNC_BEFORE, "fsync_us_after": $(fsync_probe_in "$WORK"),
  "keel_commit": "$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null)$(cd "$ROOT" && git diff --quiet HEAD 2>/dev/null || echo '+uncommitted')",
  "etcd_version": "$(etcd --version | awk '/^etcd Version/ {print $3}')",
  "rustc": "$(rustc --version)",
  "command": "bench/compare-etcd.sh $ARGS",
  "cases": [$(printf '"%s",' "${CASES[@]}" | sed 's/,$//')],
}, open(sys.argv[1], "w"), indent=1)
EOF
}

STARTED=$(date -u '+%Y-%m-%d %H:%M UTC')
install_etcd
build
FSYNC_BEFORE=$(fsync_probe_in "$WORK")
log "data in $WORK; fsync of 4 KiB takes ${FSYNC_BEFORE} µs now"
start_clusters
sample_rss & HELPER_PIDS+=($!)
wait_ready etcd
wait_ready keel
wait_ready keel-etcd
run_matrix
write_machine
report=(python3 "$ROOT/bench/report.py" --runs "$OUT/runs" --rss "$OUT/rss" --machine "$OUT/machine.json"
  --json "$OUT/summary.json")
if [ "$WRITE_DOCS" = 1 ]; then
  mkdir -p "$ROOT/bench/results"
  report+=(--markdown "$ROOT/docs/BENCHMARKS.md" --svg "$ROOT/bench/results/ratios.svg")
fi
"${report[@]}"
if [ "$WRITE_DOCS" = 1 ]; then
  cp "$OUT/summary.json" "$ROOT/bench/results/latest.json"
  log "wrote docs/BENCHMARKS.md, bench/results/ratios.svg and bench/results/latest.json"
fi
