#!/usr/bin/env bash
# Fail-over under load (issue 25): runs keel-jepsen repeatedly on a loaded 3-node cluster
# (register workload, 16 clients, 500 ops/s by default) with faults that cost it its leader:
# kill -9 of the leader, SIGSTOP of the leader, a partition isolating the leader
# (`--leader-faults` aims every kill and partition at the leader; pause always is), and kill -9
# of every node. Each fault holds 2-5 s (the nemesis plan of the seed), with at least 6 s of
# quiet after it (`--fault-gap-ms-min`), so that no fault's window (until 5 s after its stop)
# is cut short by the next fault.
# Then it gathers every fault event's windows from the runs' results.json (the availability
# measure of `keel-jepsen check`, jepsen/README.md, *Availability*) and prints, per fault
# kind, p50 / p99 / max of:
#   read, write               fault start -> first successful read (write) called after it
#   gap                       the longest time without any successful op in the window
#   healed read, healed write fault stop (heal, SIGCONT, restart; for kill-all the restart of
#                             the last node) -> first successful read (write) called after it
# "none" counts events whose window (until 5 s after the stop, the next fault or the end of
# the workload) held no such success; they count as infinitely long in the quantiles. Events
# whose window was cut short by the end of the workload (it ended less than 5 s after their
# stop: the last fault of a run) are left out and counted. The table also goes to $RESULTS.md and every event to $RESULTS.json.
#
#   bench/failover.sh                          # 5 runs of 90 s (about 9 minutes)
#   REPEATS=2 TIME_LIMIT=60 bench/failover.sh  # shorter
#   CLIENTS=spread bench/failover.sh           # raw calls round robin over the nodes
#   env: REPEATS (5), TIME_LIMIT (90, s per run), RATE (500, ops/s), CONCURRENCY (16),
#        CLIENTS (routed: keel-client; spread: keel-jepsen's --clients spread),
#        SEED (1, of the first run; run i has SEED + i - 1), FAULTS (kill,pause,partition,kill-all),
#        FAULT_GAP_MS (6000, quiet ms after each fault at least),
#        KEEL_JEPSEN_OUT (keep the run directories there), RESULTS (bench/results/failover),
#        KEEL_SKIP_BUILD (use the release binaries as they are)
#
# As root (with ip and iptables) the runs use a network namespace, as jepsen/matrix.sh's do;
# otherwise keel-jepsen's TCP proxies. Runs with kill-all start every node with
# --fault-lose-unsynced-writes (keel-jepsen does for any run asking for kill-all). Exits 1
# when a run was not valid (the table is printed all the same), 3 when it could not build.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
bin=${CARGO_TARGET_DIR:-$ROOT/target}/release
REPEATS=${REPEATS:-5} TIME_LIMIT=${TIME_LIMIT:-90} RATE=${RATE:-500} CONCURRENCY=${CONCURRENCY:-16}
SEED=${SEED:-1} FAULTS=${FAULTS:-kill,pause,partition,kill-all} FAULT_GAP_MS=${FAULT_GAP_MS:-6000}
CLIENTS=${CLIENTS:-routed}
RESULTS=${RESULTS:-$ROOT/bench/results/failover}
# A run that has not ended this long after its time limit is stopped (the cluster start,
# heal, final reads and check take well under a minute).
RUN_SLACK_S=120
out=${KEEL_JEPSEN_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/keel-failover.XXXXXX")}
mkdir -p "$out" "$(dirname "$RESULTS")"

if [ -z "${KEEL_SKIP_BUILD:-}" ]; then
  cargo build --release --bin keel --features keel-cli/fault-injection,keel-cli/planted-bugs || exit 3
  cargo build --release -p keel-jepsen --bin keel-jepsen || exit 3
fi

echo "failover: $REPEATS runs of $TIME_LIMIT s, register, $CONCURRENCY $CLIENTS clients, $RATE ops/s," \
  "faults $FAULTS at the leader, $FAULT_GAP_MS ms apart at least; runs in $out"
failures=0
for i in $(seq 1 "$REPEATS"); do
  seed=$((SEED + i - 1))
  run=$out/run-$i
  start=$SECONDS
  timeout --signal=TERM $((TIME_LIMIT + RUN_SLACK_S)) \
    "$bin/keel-jepsen" run --keel "$bin/keel" --workload register --nodes 3 \
    --clients "$CLIENTS" --concurrency "$CONCURRENCY" --rate "$RATE" --nemesis "$FAULTS" --leader-faults \
    --fault-gap-ms-min "$FAULT_GAP_MS" \
    --time-limit "$TIME_LIMIT" --seed "$seed" --out "$run" >"$run.log" 2>&1
  code=$?
  case $code in 0) verdict=valid ;; 1) verdict=invalid ;; 2) verdict=unknown ;; *) verdict="error($code)" ;; esac
  [ "$code" -eq 0 ] || failures=$((failures + 1))
  echo "run $i (seed $seed): $verdict in $((SECONDS - start)) s;" \
    "$(grep -h '^availability:' "$run.log" || echo 'no availability line')"
done

python3 - "$out" "$RESULTS" "$REPEATS x ${TIME_LIMIT} s, register, $CONCURRENCY $CLIENTS clients, $RATE ops/s, faults $FAULTS (--leader-faults, --fault-gap-ms-min $FAULT_GAP_MS), seeds $SEED..$((SEED + REPEATS - 1))" <<'EOF'
import glob, json, math, os, sys

out, results, config = sys.argv[1], sys.argv[2], sys.argv[3]
# (label, field, from the stop): the measures of jepsen/README.md, Availability.
MEASURES = [
    ("read", "first_read_ms", False),
    ("write", "first_write_ms", False),
    ("gap", "gap_ms", False),
    ("healed read", "healed_read_ms", True),
    ("healed write", "healed_write_ms", True),
]
events = []
for path in sorted(glob.glob(os.path.join(out, "run-*", "results.json"))):
    with open(path) as f:
        measure = json.load(f).get("availability") or {}
    for event in measure.get("events", []):
        event["run"] = os.path.basename(os.path.dirname(path))
        events.append(event)


def quantile(values, q):
    """Nearest rank; None (no success in the window) sorts last, as infinitely long."""
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def seconds(value):
    return "none" if value is None else f"{value / 1000:.3f}"


# A window that ends less than 5 s after the fault's stop was cut by the end of the workload
# (the last fault of a run; `--fault-gap-ms-min` keeps the next fault further away): its
# nulls and its gap are bounds, not measures, so it is left out and counted.
HEALED_WINDOW_NS = 5_000_000_000
cut = [e for e in events if e["stop"] is None or e["end"] < e["stop"] + HEALED_WINDOW_NS]
rows = []
for kind in sorted({e["fault"] for e in events}):
    of_kind = [e for e in events if e["fault"] == kind and e not in cut]
    for label, field, from_stop in MEASURES:
        values = [e[field] for e in of_kind]
        if not values:
            continue
        rows.append({
            "fault": kind, "measure": label, "events": len(values),
            "p50_ms": quantile(values, 0.50), "p99_ms": quantile(values, 0.99),
            "max_ms": quantile(values, 1.0), "none": sum(v is None for v in values),
        })

header = f"| fault | measure | events | p50 s | p99 s | max s | none |\n|---|---|---|---|---|---|---|\n"
table = header + "".join(
    f"| {r['fault']} | {r['measure']} | {r['events']} | {seconds(r['p50_ms'])} | "
    f"{seconds(r['p99_ms'])} | {seconds(r['max_ms'])} | {r['none']} |\n" for r in rows)
print()
print(f"failover: {config}; {len(events)} fault events, {len(cut)} cut by the end of a run")
print(f"{'fault':<10} {'measure':<13} {'events':>6} {'p50 s':>7} {'p99 s':>7} {'max s':>7} {'none':>5}")
for r in rows:
    print(f"{r['fault']:<10} {r['measure']:<13} {r['events']:>6} {seconds(r['p50_ms']):>7} "
          f"{seconds(r['p99_ms']):>7} {seconds(r['max_ms']):>7} {r['none']:>5}")
with open(results + ".md", "w") as f:
    f.write(f"bench/failover.sh: {config}; {len(events)} fault events, {len(cut)} cut by the "
            f"end of a run (left out)\n\n{table}")
with open(results + ".json", "w") as f:
    json.dump({"config": config, "rows": rows, "events": events, "cut": len(cut)}, f, indent=1)
print(f"written {results}.md and {results}.json")
EOF
[ $? -eq 0 ] || failures=$((failures + 1))
if [ "$failures" -ne 0 ]; then
  echo "failover: $failures run(s) not valid (or the summary failed); see $out" >&2
  exit 1
fi
