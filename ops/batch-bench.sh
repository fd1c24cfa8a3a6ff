#!/usr/bin/env bash
# SEARCH_BATCH (protocol version 4): exact hits per second over loopback, one connection
# with 256 queries in flight in every run: single SEARCH frames (depth 256), then
# SEARCH_BATCH frames of 1 (depth 256), 16 (depth 16) and 256 queries (depth 1). akerd (1
# executor, the default cache and collection: synthetic 20,000 x 32, k 10) pinned to CPU
# 0, aker-loadgen (closed loop, one sender thread) to CPU 1. The workload repeats 1,000
# distinct queries drawn uniformly, so after the warm-up every answer is an exact hit
# (the summary prints the share to show it).
# Then the Python client's own rates against the same akerd (clients/python/bench/rates.py,
# pinned to CPU 1; its venv from clients/python/ci.sh, or $PY).
#   bash ops/batch-bench.sh        # results in target/batch-bench/ (summary.md)
#   env: SECS (10s counted per run), ROUNDS (1: runs of each kind, interleaved), OUT, PY
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/target/batch-bench}
secs=${SECS:-10s}
rounds=${ROUNDS:-1}
mkdir -p "$out"
cargo build --release -q -p aker -p loadgen
. ops/akerd-lib.sh
port=7770
cat > "$out/akerd.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
executors = 1
[cache]
snapshot_load = false
snapshot_on_shutdown = false
[admin]
enabled = false
TOML
akerd_start "$out/akerd.toml" "$out/akerd.log" 0
# CPU ticks akerd has used (user + system, /proc/PID/stat fields 14 and 15).
ticks() { awk '{print $14 + $15}' "/proc/$akerd/stat"; }
# One run; NAME.cpu gets akerd's CPU seconds and the run's wall seconds (warm-up
# included), so the summary can tell whether akerd's core was the limit.
lg() {
  local name=$1
  shift
  local t0 c0
  t0=$(date +%s.%N)
  c0=$(ticks)
  taskset -c 1 ./target/release/aker-loadgen -t 127.0.0.1:$port -q --closed -c 1 -T 1 \
    --vectors 1000 --skew 0 -k 10 -w 3s -D "$secs" --json "$out/$name.json" "$@" > "$out/$name.txt"
  echo "$(ticks) $c0 $(getconf CLK_TCK) $(date +%s.%N) $t0" |
    awk '{printf "%.3f %.3f\n", ($1 - $2) / $3, $4 - $5}' > "$out/$name.cpu"
}
for r in $(seq 1 "$rounds"); do
  lg "search-r$r" -d 256
  for b in 1 16 256; do
    lg "batch$b-r$r" -d $((256 / b)) --batch "$b"
  done
done
py=${PY:-$PWD/target/py-client-venv/bin/python}
if [ -x "$py" ] && "$py" -c "import aker" 2>/dev/null; then
  taskset -c 1 "$py" clients/python/bench/rates.py --port $port --seconds "${secs%s}" \
    --batch 1 16 256 > "$out/python-rates.txt"
else
  echo "no Python client at $py (bash clients/python/ci.sh makes one): Python rates skipped" |
    tee "$out/python-rates.txt"
fi
akerd_stop
python3 ops/batch_bench_summary.py "$out" | tee "$out/summary.md"
