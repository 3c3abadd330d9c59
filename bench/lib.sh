# Shared by the bench scripts (source it; it defines functions; the callers declare the
# SERVER_PIDS array and the SERVER_NAME associative array the start_* functions fill). Every
# cluster they start runs Keel's default settings.

# stop_servers TIMEOUT_S PID...: SIGTERM to every pid, then waits up to TIMEOUT_S for each to
# exit before SIGKILL, and reaps it (when it is a child of this shell).
stop_servers() {
  local timeout_s=$1 pid waited
  shift
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "$@"; do
    waited=0
    while kill -0 "$pid" 2>/dev/null && [ $waited -lt $((timeout_s * 10)) ]; do
      sleep 0.1; waited=$((waited + 1))
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}

# stop_and_clean STATUS WORK [DIR...]: stops SERVER_PIDS (STOP_TIMEOUT_S each), removes the
# DIRs, and WORK as well when STATUS is 0 (else keeps it for its server logs and says so).
stop_and_clean() {
  local status=$1 work=$2
  shift 2
  stop_servers "$STOP_TIMEOUT_S" "${SERVER_PIDS[@]}"
  rm -rf "$@"
  if [ "$status" -ne 0 ]; then echo "kept $work (server logs)" >&2; else rm -rf "$work"; fi
}

# stop_and_clean_on_exit WORK: however the script ends, stop_and_clean with its exit status
# (WORK kept on failure); Ctrl-C and TERM end it with 130.
stop_and_clean_on_exit() {
  CLEAN_ON_EXIT_WORK=$1
  trap '_clean_on_exit' EXIT
  trap 'exit 130' INT TERM
}

_clean_on_exit() {
  local status=$?
  trap - EXIT INT TERM
  stop_and_clean $status "$CLEAN_ON_EXIT_WORK"
  exit $status
}

# The three client addresses of a cluster whose nodes listen on 127.0.0.1:BASE+1..BASE+3.
cluster_endpoints() { # base port
  echo "127.0.0.1:$(($1 + 1)),127.0.0.1:$(($1 + 2)),127.0.0.1:$(($1 + 3))"
}

# start_keel_cluster NAME KEEL BASE DIR [SERVE_ARG...]: three `keel serve` nodes on
# 127.0.0.1:BASE+1..3, data in DIR/NAME-<i>, output in DIR/NAME-<i>.log, with the SERVE_ARGs;
# with ETCD_LISTEN_BASE set, each also serves etcd's API on 127.0.0.1:ETCD_LISTEN_BASE+i.
# Appends each pid to SERVER_PIDS and names it in SERVER_NAME (the caller declares both: an
# array and an associative array).
start_keel_cluster() {
  local name=$1 keel=$2 base=$3 dir=$4 i cluster=""
  shift 4
  for i in 1 2 3; do cluster+="${cluster:+,}$i=127.0.0.1:$((base + i))"; done
  for i in 1 2 3; do
    local etcd=()
    [ -z "${ETCD_LISTEN_BASE:-}" ] || etcd=(--etcd-listen "127.0.0.1:$((ETCD_LISTEN_BASE + i))")
    "$keel" serve --node-id "$i" --listen "127.0.0.1:$((base + i))" \
      --data-dir "$dir/$name-$i" --initial-cluster "$cluster" "${etcd[@]}" "$@" >"$dir/$name-$i.log" 2>&1 &
    SERVER_PIDS+=($!)
    SERVER_NAME[$!]=$name-$i
  done
}

# start_etcd_cluster NAME CLIENT_BASE PEER_BASE DIR: three etcd members (defaults: fsync on
# every commit), clients on 127.0.0.1:CLIENT_BASE+1..3, peers on PEER_BASE+1..3, data and
# output as for start_keel_cluster.
start_etcd_cluster() {
  local name=$1 client_base=$2 peer_base=$3 dir=$4 i cluster=""
  for i in 1 2 3; do cluster+="${cluster:+,}$name-$i=http://127.0.0.1:$((peer_base + i))"; done
  for i in 1 2 3; do
    etcd --name "$name-$i" --data-dir "$dir/$name-$i" \
      --listen-client-urls "http://127.0.0.1:$((client_base + i))" \
      --advertise-client-urls "http://127.0.0.1:$((client_base + i))" \
      --listen-peer-urls "http://127.0.0.1:$((peer_base + i))" \
      --initial-advertise-peer-urls "http://127.0.0.1:$((peer_base + i))" \
      --initial-cluster "$cluster" --initial-cluster-state new \
      --initial-cluster-token "$name" --logger zap --log-outputs stderr >"$dir/$name-$i.log" 2>&1 &
    SERVER_PIDS+=($!)
    SERVER_NAME[$!]=$name-$i
  done
}

# wait_for_put BENCH TARGET ENDPOINTS TIMEOUT_S: until a one-key put succeeds (keel-bench
# --target keel|etcd); fails after TIMEOUT_S seconds.
wait_for_put() {
  local bench=$1 target=$2 endpoints=$3 deadline=$((SECONDS + $4))
  until "$bench" --target "$target" --endpoints "$endpoints" --op put --keyspace 1 \
      --duration 200ms --warmup 0s >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 1
  done
}

# Microseconds per 4 KiB synchronous write in DIR, from 200 dsync writes.
fsync_probe_in() { # dir
  local seconds
  seconds=$(dd if=/dev/zero of="$1/fsync-probe" bs=4k count=200 oflag=dsync 2>&1 |
    awk '/copied/ {for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) print $(i - 1)}')
  rm -f "$1/fsync-probe"
  awk -v s="${seconds:-0}" 'BEGIN { printf "%.0f", s * 1e6 / 200 }'
}
