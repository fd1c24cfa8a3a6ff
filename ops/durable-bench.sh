#!/usr/bin/env bash
# What durability costs (#24): akerd's embedded store in memory against the same store
# with backend.data_dir (log synced before each acknowledgement, group commit), on the
# default synthetic collection (20,000 x 32, HNSW). akerd on core 1, aker-loadgen on
# core 0; loopback only; every run bounded by its duration.
#   insert-mem-cN / insert-durable-cN   closed loop, N connections x 1 deep, INSERTs only:
#                                       inserts/s and the acknowledged insert's latency
#   search-mem / search-durable         open-loop SEARCH at 2,000/s while one connection
#                                       inserts at 1,000/s; with data_dir the log reaches
#                                       checkpoint_log_bytes (256 KiB) every ~1.6 s, so
#                                       checkpoints run during the counted part
#   bash ops/durable-bench.sh [DURATION_S]     # results in target/durable-bench/
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10}
out=$PWD/target/durable-bench
rm -rf "$out"; mkdir -p "$out"
cargo build --release -q -p aker -p loadgen
port=7730
. ops/akerd-lib.sh
start() {  # NAME DATA_DIR_LINE
  cat > "$out/$1.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
executors = 1
[cache]
recall_floor = 0.0
[backend]
$2
checkpoint_log_bytes = 262144
[admin]
enabled = false
TOML
  akerd_start "$out/$1.toml" "$out/$1.log" 1
}
lg() { taskset -c 0 ./target/release/aker-loadgen -t 127.0.0.1:$port -q "$@"; }
for mode in mem durable; do
  line=""
  [ $mode = durable ] && line="data_dir = \"$out/data\""
  rm -rf "$out/data"
  start "akerd-$mode" "$line"
  for c in 1 8; do
    lg --closed -c $c -d 1 -w 1s -D "${dur}s" --mix insert=100 --vectors 5000 \
       --id-base $((1000000 * c)) --json "$out/insert-$mode-c$c.json" > /dev/null
  done
  lg -c 1 -d 1 -r 1000 -w 2s -D "${dur}s" --mix insert=100 --vectors 5000 --id-base 9000000 \
     --json "$out/writes-beside-$mode.json" > /dev/null &
  wl=$!
  lg -c 4 -d 4 -r 2000 -w 2s -D "${dur}s" --mix search=100 --vectors 5000 \
     --json "$out/search-$mode.json" > /dev/null
  wait $wl || true
  [ $mode = durable ] && grep -c "checkpoint written" "$out/akerd-$mode.log" > "$out/checkpoints" || true
  akerd_stop
done
# Start-up on GloVe (the .npy: 400,000 x 50, exact index): the first start imports the .npy into
# data_dir, the second recovers from the checkpoint; "ready" after each, from akerd's log.
if [ -f data/glove-6b-50d.npy ]; then
  rm -rf "$out/glove-data"
  for start in import recover; do
    cat > "$out/glove-$start.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
executors = 1
[cache]
recall_floor = 0.0
[backend]
index = "exact"
data = { kind = "file", path = "$PWD/data/glove-6b-50d.npy" }
data_dir = "$out/glove-data"
[admin]
enabled = false
TOML
    t0=$(date +%s.%N)
    akerd_start "$out/glove-$start.toml" "$out/glove-$start.log" 1
    echo "$(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$t0" "$(date +%s.%N)")" \
      > "$out/glove-$start.seconds"
    akerd_stop
  done
  du -sb "$out/glove-data" | cut -f1 > "$out/glove-data.bytes"
fi
python3 ops/durable_bench_summary.py "$out" | tee "$out/summary.md"
