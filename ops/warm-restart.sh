#!/usr/bin/env bash
# The cache's warm restart (#24): the same 10,000 requests served by an akerd that never
# restarted, by one restarted warm (SIGTERM writes the snapshot, the start restores it),
# and by one restarted cold (cache.snapshot_load = false). GloVe (399,000 x 50, exact
# durable store), the runner's simZipf 0.99 trace: its first WARM_OPS searches warm the
# cache, the next 10,000 are measured (hit ratio, recall@10 against exact ground truth).
# Pool 5% of the collection in objects, akerd's default policy. akerd on cores 0-1,
# loadgen on core 1, closed loop over one connection with one request in flight, so
# every run sends the trace in the same order; loopback only.
#   bash ops/warm-restart.sh            # results in target/warm-restart/
#   env: WARM_OPS (30000), OUT (target/warm-restart), CONNECTIONS (1), DEPTH (1),
#        FLOOR (cache.recall_floor; unset: akerd's default)
set -euo pipefail
cd "$(dirname "$0")/.."
warm_ops=${WARM_OPS:-30000}
out=${OUT:-$PWD/target/warm-restart}
mkdir -p "$out"
cargo build --release -q -p aker -p loadgen -p bench
trace=$out/glove-0.99.trace
base=$out/glove-base.fvecs
if [ ! -f "$trace" ]; then
  [ -f data/glove-6b-50d.npy ] || bash ops/get-glove.sh
  ./target/release/bench trace --dataset glove --skew 0.99 --requests $((warm_ops + 10000)) \
    --data-dir data --cache-dir data/cache --out "$trace" --base-out "$base"
fi
python3 ops/trace_split.py "$trace" "$warm_ops" "$out/warm.trace" "$out/measure.trace"
port=7750
. ops/akerd-lib.sh
config() { # NAME LOAD
  cat > "$out/$1.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
executors = 1
request_timeout_ms = 60000
[cache]
capacity_objects = 19950
snapshot_load = $2
${FLOOR:+recall_floor = $FLOOR}
[backend]
index = "exact"
threads = 2
data = { kind = "file", path = "$base" }
data_dir = "$1-data"
[admin]
enabled = true
listen = "127.0.0.1:$((port + 1))"
TOML
}
replay() { # TRACE JSON
  taskset -c 1 ./target/release/aker-loadgen -t 127.0.0.1:$port -q -c "${CONNECTIONS:-1}" -d "${DEPTH:-1}" --closed \
    --trace "$1" -w 0s -D 600s --json "$2" > /dev/null
}
for run in never warm cold; do
  load=true
  [ $run = cold ] && load=false
  rm -rf "$out/$run-data"
  config $run $load
  akerd_start "$out/$run.toml" "$out/$run-first.log" 0-1
  replay "$out/warm.trace" "$out/$run-warmup.json"
  if [ $run != never ]; then
    akerd_stop
    t0=$(date +%s.%N)
    akerd_start "$out/$run.toml" "$out/$run-restart.log" 0-1
    t1=$(date +%s.%N)
    echo "$run restart: $(python3 -c "print(f'{$t1 - $t0:.2f}')") s to ready (script's view)" \
      | tee "$out/$run-restart.txt"
  fi
  replay "$out/measure.trace" "$out/$run-measure.json"
  curl -s "http://127.0.0.1:$((port + 1))/metrics" > "$out/$run.metrics" || true
  akerd_stop
done
python3 - "$out" <<'PY' | tee "$out/summary.md"
import json, os, sys
out = sys.argv[1]
print("| run | hit % (10,000 measured) | recall@10 | searches/s | restart to ready |")
print("|---|---:|---:|---:|---|")
for run in ("never", "warm", "cold"):
    r = json.load(open(os.path.join(out, f"{run}-measure.json")))["run"]
    t = os.path.join(out, f"{run}-restart.txt")
    rs = open(t).read().split(": ")[1].strip() if os.path.exists(t) else "-"
    print(f"| {run} | {100 * r.get('hit_ratio', 0):.1f} | {r.get('recall') or 0:.3f} | "
          f"{r['throughput']:.0f} | {rs} |")
PY
grep -h "cache snapshot\|durable store recovered" "$out"/warm-*.log "$out"/cold-*.log | cut -c1-400 || true
