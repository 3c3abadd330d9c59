#!/usr/bin/env bash
# The full matrix of the Jepsen-style harness (issues 6 and 17): every workload under every
# fault alone and all faults together on one range, and register and follower-read again with
# spread clients (`--clients spread`: raw calls round robin over the nodes, which forward to
# the leader, no retries), register and watch through etcd's API (`--clients etcd`, on one
# range's faults and, over 8 ranges, the range faults), then every workload over 8 ranges under
# each range fault (split, move, membership, disk, corrupt) and all eleven faults together (each must be
# valid), then every planted bug with the workload and faults that must catch it (each must be
# invalid). Prints a table of verdicts, ops, faults, the longest gap without a successful op
# around any fault of the run (gap-s, seconds) and run times; exits non-zero if any row is not
# what it should be.
#
#   jepsen/matrix.sh                        # 60 s per run (about 2 h in all)
#   ROWS=ranges jepsen/matrix.sh            # only the rows over 8 ranges and their planted bugs
#   ROWS=one-range jepsen/matrix.sh         # only the rows on one range and their planted bugs
#   ROWS=spread jepsen/matrix.sh            # only the spread-client rows and their planted bug
#   ROWS=etcd jepsen/matrix.sh              # only the rows through etcd's API and their planted bug
#   TIME_LIMIT=30 SEED=7 jepsen/matrix.sh   # shorter runs, another seed
#   KEEL_JEPSEN_OUT=DIR jepsen/matrix.sh    # keep the run directories there
set -uo pipefail
cd "$(dirname "$0")/.."
# Where cargo puts release binaries (CARGO_TARGET_DIR when set).
bin=${CARGO_TARGET_DIR:-target}/release

time_limit=${TIME_LIMIT:-60}
# Runs with several fault kinds get at least 3 s of warm-up and 9 s per kind: up to 8 s per
# fault (hold 2-5 s, gap 1-3 s), 10 s for the long ones (membership outages and disk faults
# hold 7 s), or the coverage checker rightly fails the run for a kind that never happened.
seconds_per_kind=9
rows=${ROWS:-all}
seed=${SEED:-1}
out=${KEEL_JEPSEN_OUT:-$(mktemp -d /tmp/keel-jepsen-matrix.XXXXXX)}
mkdir -p "$out"

cargo build --release --bin keel --features keel-cli/fault-injection,keel-cli/planted-bugs || exit 3
# The etcd feature (--clients etcd) builds etcd-client, whose build script needs protoc.
PROTOC=${PROTOC:-$(bench/protoc-path.sh)} || exit 3
export PROTOC
cargo build --release -p keel-jepsen --bin keel-jepsen --features etcd || exit 3

workloads=(register append counter follower-read fencing idempotency watch)
# The workloads that also run with --clients spread, on one range under every fault above.
spread_workloads=(register follower-read)
# The workloads that also run through etcd's API (--clients etcd), under every fault.
etcd_workloads=(register watch)
faults=(partition kill kill-all pause leader-transfer clock partition,kill,kill-all,pause,leader-transfer,clock)
# Over 8 ranges on 5 nodes (moves need a node without a replica).
range_flags="--ranges 8 --nodes 5"
range_faults=(split move membership disk corrupt partition,kill,kill-all,pause,leader-transfer,clock,split,move,membership,disk,corrupt)
# Through etcd's API the workload's keys are in etcd's namespace, one range that never
# splits: the range faults but split.
etcd_range_faults=(move membership disk corrupt partition,kill,kill-all,pause,leader-transfer,clock,move,membership,disk,corrupt)
# planted bug | workload | faults (empty: none) | extra flags
planted=(
    "stale-read|register|partition|"
    "ack-before-fsync|register|kill-all|"
    "double-apply|counter|partition|--response-loss-percent 5"
    "lock-no-expiry|fencing||"
    "idem-stale-complete|idempotency||"
    "unbounded-read|follower-read|partition|"
    "watch-skips-event|watch|partition|"
    "read-at-ignores-history|watch|partition|"
    "stale-read|register|partition|--clients spread"
    "stale-read|register|partition|--clients etcd"
    "watch-skips-event|watch|partition|--clients etcd"
)
range_planted=(
    "split-drops-inflight|register|split|$range_flags"
    "stale-span|follower-read|split,move|$range_flags"
    "snapshot-skip-tail|register|move|$range_flags"
    "skip-repair|register|corrupt|$range_flags"
)

verdict() { case $1 in 0) echo valid ;; 1) echo invalid ;; 2) echo unknown ;; *) echo "error($1)" ;; esac; }
failures=0
table=$(printf '%-13s %-7s %-6s %-52s %-20s %-8s %-10s %6s %6s %6s %6s\n' workload clients ranges faults planted-bug expected verdict ops faults gap-s seconds)

# row WORKLOAD FAULTS BUG EXPECTED EXTRA...
row() {
    local workload=$1 nemesis=$2 bug=$3 expected=$4
    shift 4
    local name="$workload-${nemesis:-none}"
    name="${name//,/+}${bug:+-$bug}"
    [[ " $* " == *" --ranges "* ]] && name="$name-ranges"
    local clients=routed
    [[ " $* " == *" --clients spread "* ]] && clients=spread name="$name-spread"
    [[ " $* " == *" --clients etcd "* ]] && clients=etcd name="$name-etcd"
    local start=$SECONDS
    local limit=$time_limit
    local kinds
    kinds=$(echo "$nemesis" | tr ',' '\n' | grep -c .)
    if [ "$kinds" -gt 1 ] && [ "$limit" -lt $((3 + seconds_per_kind * kinds)) ]; then
        limit=$((3 + seconds_per_kind * kinds))
    fi
    local flags=(--workload "$workload" --time-limit "$limit" --seed "$seed")
    [ -n "$nemesis" ] && flags+=(--nemesis "$nemesis")
    [ -n "$bug" ] && flags+=(--planted-bug "$bug")
    "$bin/keel-jepsen" run --keel "$bin/keel" --out "$out/$name" "${flags[@]}" "$@" \
        >"$out/$name.log" 2>&1
    # Keep the exit code before anything else runs: even `local` resets $? to 0.
    local code=$?
    local got
    got=$(verdict "$code")
    local line
    local ops faults_seen gap
    ops=$(sed -n 's/^run: \([0-9]*\) ops, \([0-9]*\) faults.*/\1/p' "$out/$name.log")
    faults_seen=$(sed -n 's/^run: \([0-9]*\) ops, \([0-9]*\) faults.*/\2/p' "$out/$name.log")
    # The longest gap without a successful op around any fault of the run (check's
    # `availability:` line; jepsen/README.md, Availability).
    gap=$(sed -n 's/^availability: longest gap \([0-9.]*\) s.*/\1/p' "$out/$name.log")
    line=$(printf '%-13s %-7s %-6s %-52s %-20s %-8s %-10s %6s %6s %6s %6d' "$workload" "$clients" "${ranges:-1}" "${nemesis:--}" "${bug:--}" "$expected" "$got" "${ops:--}" "${faults_seen:--}" "${gap:--}" $((SECONDS - start)))
    echo "$line"
    table+=$'\n'"$line"
    [ "$got" = "$expected" ] || failures=$((failures + 1))
}

case "$rows" in
    all|one-range|ranges|spread|etcd) ;;
    *) echo "matrix.sh: ROWS must be all, one-range, ranges, spread or etcd" >&2; exit 2 ;;
esac
if [ "$rows" = all ] || [ "$rows" = one-range ]; then
    ranges=1
    for workload in "${workloads[@]}"; do
        for nemesis in "${faults[@]}"; do
            row "$workload" "$nemesis" "" valid
        done
    done
fi
if [ "$rows" = all ] || [ "$rows" = one-range ] || [ "$rows" = spread ]; then
    ranges=1
    for workload in "${spread_workloads[@]}"; do
        for nemesis in "${faults[@]}"; do
            row "$workload" "$nemesis" "" valid --clients spread
        done
    done
fi
if [ "$rows" = all ] || [ "$rows" = etcd ]; then
    for workload in "${etcd_workloads[@]}"; do
        ranges=1
        for nemesis in "${faults[@]}"; do
            row "$workload" "$nemesis" "" valid --clients etcd
        done
        ranges=8
        for nemesis in "${etcd_range_faults[@]}"; do
            # shellcheck disable=SC2086 # the flags are words
            row "$workload" "$nemesis" "" valid --clients etcd $range_flags
        done
    done
fi
if [ "$rows" != ranges ]; then
    ranges=1
    for entry in "${planted[@]}"; do
        IFS='|' read -r bug workload nemesis extra <<<"$entry"
        [ "$rows" = spread ] && [[ " $extra " != *" --clients spread "* ]] && continue
        [ "$rows" = etcd ] && [[ " $extra " != *" --clients etcd "* ]] && continue
        # shellcheck disable=SC2086 # extra flags are words
        row "$workload" "$nemesis" "$bug" invalid $extra
    done
fi
if [ "$rows" = all ] || [ "$rows" = ranges ]; then
    ranges=8
    for workload in "${workloads[@]}"; do
        for nemesis in "${range_faults[@]}"; do
            # shellcheck disable=SC2086 # the flags are words
            row "$workload" "$nemesis" "" valid $range_flags
        done
    done
    for entry in "${range_planted[@]}"; do
        IFS='|' read -r bug workload nemesis extra <<<"$entry"
        # shellcheck disable=SC2086 # extra flags are words
        row "$workload" "$nemesis" "$bug" invalid $extra
    done
fi

echo
echo "$table"
echo "runs in $out"
if [ "$failures" -ne 0 ]; then
    echo "keel-jepsen matrix: $failures row(s) not as expected" >&2
    exit 1
fi
echo "keel-jepsen matrix: ok"
