#!/usr/bin/env bash
# Smoke of the Jepsen-style harness (issues 6, 17 and 26), as CI runs it (about 5.5 minutes): a
# register run under partitions and kill -9 that must be valid, one over 4 ranges under splits
# and kill -9 that must be valid, a short register run with spread clients (raw calls round
# robin over the nodes, no retries) under kill -9 that must be valid, one through etcd's API
# (etcd-client round robin over the nodes' etcd ports) over 4 ranges under kill -9 and a
# watch run through etcd's API under partitions that must be valid, a counter run with the
# double-apply planted bug and a fencing run with the lock-no-expiry planted bug (no faults
# needed: holds overlap within seconds) that must be invalid, a watch run over 4 ranges, and
# a register run under `corrupt` that must be valid (the consistency checks repair every
# corrupted replica) and invalid with the skip-repair planted bug. Builds the release
# binaries first. Needs root for a
# network namespace (falls back to the TCP proxy without). Prints each verdict and run time;
# exits non-zero if any expectation fails.
#
#   jepsen/smoke.sh                 # run directories under a fresh /tmp/keel-jepsen-smoke.*
#   KEEL_JEPSEN_OUT=DIR jepsen/smoke.sh
set -uo pipefail
cd "$(dirname "$0")/.."
# Where cargo puts release binaries (CARGO_TARGET_DIR when set).
bin=${CARGO_TARGET_DIR:-target}/release

cargo build --release --bin keel --features keel-cli/fault-injection,keel-cli/planted-bugs || exit 3
# The etcd feature (--clients etcd) builds etcd-client, whose build script needs protoc.
PROTOC=${PROTOC:-$(bench/protoc-path.sh)} || exit 3
export PROTOC
cargo build --release -p keel-jepsen --bin keel-jepsen --features etcd || exit 3

out=${KEEL_JEPSEN_OUT:-$(mktemp -d /tmp/keel-jepsen-smoke.XXXXXX)}
mkdir -p "$out"
verdict() { case $1 in 0) echo valid ;; 1) echo invalid ;; 2) echo unknown ;; *) echo "error($1)" ;; esac; }
failures=0
summary=""

# run NAME EXPECTED-VERDICT ARGS...
run() {
    local name=$1 expected=$2
    shift 2
    local start=$SECONDS
    "$bin/keel-jepsen" run --keel "$bin/keel" --out "$out/$name" "$@"
    local code=$?
    local got
    got=$(verdict "$code")
    local line
    line=$(printf '%-16s expected %-8s got %-10s %4d s  %s' "$name" "$expected" "$got" $((SECONDS - start)) "$out/$name")
    summary+="$line"$'\n'
    if [ "$got" != "$expected" ]; then
        failures=$((failures + 1))
    fi
}

run register valid --workload register --nemesis partition,kill --time-limit 60 --seed 1
run register-ranges valid --workload register --ranges 4 --nemesis split,kill --time-limit 45 --seed 1
run register-spread valid --workload register --clients spread --nemesis kill --time-limit 20 --seed 1
run register-etcd valid --workload register --clients etcd --ranges 4 --nemesis kill --time-limit 20 --seed 1
run watch-etcd valid --workload watch --clients etcd --nemesis partition --time-limit 20 --seed 1
run double-apply invalid --workload counter --nemesis partition --planted-bug double-apply \
    --response-loss-percent 5 \
    --time-limit 30 --seed 1
run lock-no-expiry invalid --workload fencing --planted-bug lock-no-expiry --time-limit 10 --seed 1
run watch-ranges valid --workload watch --ranges 4 --nemesis split,kill --time-limit 30 --seed 1
run register-corrupt valid --workload register --nemesis corrupt --time-limit 20 --seed 1
run skip-repair invalid --workload register --nemesis corrupt --planted-bug skip-repair \
    --time-limit 20 --seed 1

echo
echo "keel-jepsen smoke:"
printf '%s' "$summary"
if [ "$failures" -ne 0 ]; then
    echo "keel-jepsen smoke: $failures expectation(s) failed" >&2
    exit 1
fi
echo "keel-jepsen smoke: ok"
