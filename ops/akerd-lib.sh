# Sourced by ops/ benchmark scripts (from the repository root): one akerd at a time.
#   akerd_start CONFIG LOG [CPUS]   start it (pinned to CPUS when given); returns once its
#                                   log says ready, exits the script if it dies first or
#                                   is not ready within AKERD_READY_S (60) seconds
#   akerd_stop                      stop it and wait for it
# An akerd still running when the script exits is killed.
akerd=
akerd_start() {
  if [ -n "${3:-}" ]; then
    taskset -c "$3" ./target/release/akerd --config "$1" > "$2" 2>&1 &
  else
    ./target/release/akerd --config "$1" > "$2" 2>&1 &
  fi
  akerd=$!
  local ready_s=${AKERD_READY_S:-60}
  for _ in $(seq 1 $((ready_s * 10))); do
    grep -q "akerd: ready" "$2" && return 0
    kill -0 "$akerd" 2>/dev/null || { tail "$2" >&2; exit 1; }
    sleep 0.1
  done
  echo "akerd did not get ready in $ready_s s ($2)" >&2
  exit 1
}
akerd_stop() {
  if [ -n "$akerd" ]; then
    kill "$akerd"
    wait "$akerd" 2>/dev/null || true
  fi
  akerd=
}
akerd_cleanup() { if [ -n "$akerd" ]; then kill "$akerd" 2>/dev/null || true; fi; }
trap akerd_cleanup EXIT
