# Shared by the bench scripts (source it; it defines functions only).

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
