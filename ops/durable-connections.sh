#!/usr/bin/env bash
# Follow-up to ops/durable-bench.sh (#24): acknowledged inserts at 1,000/s from 1 or 4
# connections (1 deep each), alone and (4 connections) beside open-loop searches at
# 2,000/s, in memory and with data_dir (a checkpoint every 256 KiB of log). akerd pinned
# to core 1, aker-loadgen to core 0; loopback only; every run bounded by its duration.
#   bash ops/durable-connections.sh      # results in target/durable-connections/
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/target/durable-connections}
rm -rf "$out"; mkdir -p "$out"
cargo build --release -q -p aker -p loadgen
port=7735
. ops/akerd-lib.sh
lg() { taskset -c 0 ./target/release/aker-loadgen -t 127.0.0.1:$port -q "$@"; }
for mode in mem durable; do
  line=""
  [ $mode = durable ] && line="data_dir = \"$out/data\""
  rm -rf "$out/data"
  cat > "$out/$mode.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
executors = 1
[cache]
recall_floor = 0.0
[backend]
$line
checkpoint_log_bytes = 262144
[admin]
enabled = false
TOML
  akerd_start "$out/$mode.toml" "$out/$mode.log" 1
  for c in 1 4; do
    lg -c $c -d 1 -r 1000 -w 2s -D 10s --mix insert=100 --vectors 5000 \
       --id-base $((2000000 * c)) --json "$out/alone-$mode-c$c.json" > /dev/null
  done
  lg -c 4 -d 1 -r 1000 -w 2s -D 10s --mix insert=100 --vectors 5000 --id-base 9000000 \
     --json "$out/beside-$mode-c4.json" > /dev/null &
  wl=$!
  lg -c 4 -d 4 -r 2000 -w 2s -D 10s --mix search=100 --vectors 5000 \
     --json "$out/search-$mode.json" > /dev/null
  wait $wl
  akerd_stop
done
python3 - "$out" <<'PY' | tee "$out/summary.md"
import json, os, sys
d = sys.argv[1]
print("| run | served/s | p50 ms | p99 ms | p99.9 ms |")
print("|---|---:|---:|---:|---:|")
for name in sorted(f[:-5] for f in os.listdir(d) if f.endswith(".json")):
    r = json.load(open(os.path.join(d, name + ".json")))["run"]
    o = next(x for x in r["ops"] if x["op"] in ("INSERT", "SEARCH"))
    l = o["latency"]
    print(f"| {name} ({o['op']}) | {r['throughput']:.0f} | {l['p50_ms']} | {l['p99_ms']} | {l['p999_ms']} |")
PY
