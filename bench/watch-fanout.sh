#!/usr/bin/env bash
# Watch fan-out, Keel against etcd on this machine: a 3-node etcd and a 3-node Keel (both at
# their defaults) on loopback. Each run puts with CLIENTS keel-bench clients for DURATION
# while W watches of every written key (opened by the same keel-bench before the load, over
# 8 connections of their own) receive the events, for W in WATCHERS (0 = no watcher: the put
# throughput the others are compared with). Keel runs twice, its puts routed by keel-client
# (keel) and spread over the nodes (keel-spread); its watches go through keel-client both
# times (any replica serves a watch). The systems take turns, the order rotating, REPEATS
# times. Server CPU: the three servers' user+system time over the keel-bench run (connect,
# watches opened, warm-up, measured time), per second of it.
#
# Prints one line per run and a table of medians over the repeats: put ops/s (and as a share
# of the same system's without watchers), put errors, events delivered per second (all
# watchers together), put->event latency p50/p99, watch errors, server CPU; then Keel/etcd
# ratios per watcher count.
#
#   bench/watch-fanout.sh            # 3 repeats, 10 s measured + 2 s warm-up per run
#   bench/watch-fanout.sh --quick    # 1 repeat, 4 s + 1 s
#   env: WATCHERS="0 1 100 1000", CLIENTS=16, REPEATS, DURATION, WARMUP, OUT (results dir;
#        default: a temporary one, kept)
#
# Needs: cargo, python3, and etcd (installed from Debian's etcd-server when missing; root or
# sudo), the same as bench/compare-etcd.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"

REPEATS=${REPEATS:-3} DURATION=${DURATION:-10s} WARMUP=${WARMUP:-2s} MODE=full
case "${1:-}" in
  --quick) REPEATS=1 DURATION=4s WARMUP=1s MODE=quick ;;
  '') ;;
  *) sed -n '2,24p' "$0"; exit 2 ;;
esac
WATCHERS=${WATCHERS:-0 1 100 1000} CLIENTS=${CLIENTS:-16}
KEEL_PORT=27800 ETCD_CLIENT_PORT=27810 ETCD_PEER_PORT=27820
CONNECTIONS=8 READY_TIMEOUT_S=90 STOP_TIMEOUT_S=10
WORK=$(mktemp -d "${TMPDIR:-/tmp}/keel-watch-fanout.XXXXXX")
OUT=${OUT:-$WORK-results}
mkdir -p "$OUT/runs"
SERVER_PIDS=()
declare -A SERVER_NAME=()
stop_and_clean_on_exit "$WORK"

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

command -v etcd >/dev/null || {
  log "installing etcd-server from Debian"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y etcd-server >/dev/null ||
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y etcd-server >/dev/null; }
}
export PROTOC=${PROTOC:-$(command -v protoc || "$ROOT/bench/protoc-path.sh")}
log "building release keel and keel-bench --features etcd"
(cd "$ROOT" && cargo build --release -q -p keel-cli -p keel-bench --features keel-bench/etcd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
KEEL=$TARGET_DIR/release/keel BENCH=$TARGET_DIR/release/keel-bench

start_etcd_cluster etcd "$ETCD_CLIENT_PORT" "$ETCD_PEER_PORT" "$WORK"
start_keel_cluster keel "$KEEL" "$KEEL_PORT" "$WORK"
declare -A ENDPOINTS=([etcd]=$(cluster_endpoints "$ETCD_CLIENT_PORT")
  [keel]=$(cluster_endpoints "$KEEL_PORT") [keel-spread]=$(cluster_endpoints "$KEEL_PORT"))
for target in keel etcd; do
  wait_for_put "$BENCH" "$target" "${ENDPOINTS[$target]}" "$READY_TIMEOUT_S" ||
    { log "$target did not become ready; its logs are in $WORK"; exit 1; }
done

# The CPU seconds (user + system) the servers of SYSTEM's cluster have used so far.
server_cpu_s() { # system
  local name=${1%-spread} pid total=0
  for pid in "${SERVER_PIDS[@]}"; do
    [ "${SERVER_NAME[$pid]%-*}" = "$name" ] || continue
    total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
  done
  awk -v ticks="$total" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f", ticks / hz }'
}

run() { # system watchers repeat
  local system=$1 watchers=$2 repeat=$3 target=(--target keel --route leader)
  case $system in
    keel-spread) target=(--target keel --route spread) ;;
    etcd) target=(--target etcd) ;;
  esac
  local json="$OUT/runs/w$watchers.$system.$repeat.json" cpu_before cpu_after start end
  cpu_before=$(server_cpu_s "$system") start=$(date +%s.%N)
  "$BENCH" "${target[@]}" --endpoints "${ENDPOINTS[$system]}" --op put --clients "$CLIENTS" \
    --connections "$CONNECTIONS" --watchers "$watchers" --duration "$DURATION" \
    --warmup "$WARMUP" --value-bytes 256 --keyspace 10000 --no-preload --seed "$repeat" \
    --json "$json" >>"$OUT/runs.log" 2>&1 || log "  $system w$watchers failed (see $OUT/runs.log)"
  end=$(date +%s.%N) cpu_after=$(server_cpu_s "$system")
  awk -v a="$cpu_before" -v b="$cpu_after" -v s="$start" -v e="$end" \
    'BEGIN { printf "%.3f\n", (b - a) / (e - s) }' >"$OUT/runs/w$watchers.$system.$repeat.cpu"
  echo "repeat $repeat $system watchers=$watchers: $(tail -n 2 "$OUT/runs.log" | grep -v '^target ' | tr '\n' ' ')"
}

for repeat in $(seq 1 "$REPEATS"); do
  index=0
  for watchers in $WATCHERS; do
    case $(((repeat + index) % 3)) in
      0) order="keel keel-spread etcd" ;;
      1) order="keel-spread etcd keel" ;;
      *) order="etcd keel keel-spread" ;;
    esac
    for system in $order; do run "$system" "$watchers" "$repeat"; done
    index=$((index + 1))
  done
done

python3 - "$OUT" "$MODE" "$WATCHERS" <<'EOF'
import glob, json, os, statistics, sys
out, mode, counts = sys.argv[1], sys.argv[2], [int(w) for w in sys.argv[3].split()]
systems = ["keel", "keel-spread", "etcd"]
rows = {}
for system in systems:
    for w in counts:
        runs = []
        for path in sorted(glob.glob(f"{out}/runs/w{w}.{system}.*.json")):
            with open(path) as f:
                run = json.load(f)
            with open(path[:-5] + ".cpu") as f:
                run["cpu"] = float(f.read())
            runs.append(run)
        if runs:
            rows[(system, w)] = runs
def median(runs, get):
    return statistics.median(get(run) for run in runs)
def watch(run, field):
    return (run.get("watch") or {}).get(field, 0)
print(f"\nwatch fan-out ({mode}): medians over the repeats; errors summed")
print(f"{'system':<12} {'watchers':>8} {'put ops/s':>10} {'of w=0':>7} {'put err':>7} "
      f"{'events/s':>11} {'p50 µs':>8} {'p99 µs':>8} {'watch err':>9} {'server CPU':>10}")
table = {}
for (system, w), runs in rows.items():
    ops = median(runs, lambda r: r["ops_per_sec"])
    base = rows.get((system, 0))
    share = ops / median(base, lambda r: r["ops_per_sec"]) if base else float("nan")
    row = dict(ops=ops, share=share, errors=sum(r["errors"] for r in runs),
               events=median(runs, lambda r: watch(r, "events_per_sec")),
               p50=median(runs, lambda r: watch(r, "p50_us")),
               p99=median(runs, lambda r: watch(r, "p99_us")),
               watch_errors=sum(watch(r, "errors") for r in runs),
               cpu=median(runs, lambda r: r["cpu"]))
    table[(system, w)] = row
    print(f"{system:<12} {w:>8} {row['ops']:>10.0f} {row['share']:>7.2f} {row['errors']:>7} "
          f"{row['events']:>11.0f} {row['p50']:>8.0f} {row['p99']:>8.0f} {row['watch_errors']:>9} "
          f"{row['cpu']:>10.2f}")
print("\nKeel/etcd (keel = puts routed by keel-client; keel-spread = puts spread):")
print(f"{'watchers':>8} {'system':<12} {'events/s':>9} {'p99':>6} {'put ops/s':>9}")
for w in counts:
    if w == 0 or (("etcd", w) not in table):
        continue
    e = table[("etcd", w)]
    for system in ("keel", "keel-spread"):
        k = table.get((system, w))
        if not k:
            continue
        ratio = lambda a, b: a / b if b else float("nan")
        print(f"{w:>8} {system:<12} {ratio(k['events'], e['events']):>9.2f} "
              f"{ratio(k['p99'], e['p99']):>6.2f} {ratio(k['ops'], e['ops']):>9.2f}")
json.dump({f"{s}/{w}": row for (s, w), row in table.items()},
          open(os.path.join(out, "summary.json"), "w"), indent=1)
EOF
log "results in $OUT"
