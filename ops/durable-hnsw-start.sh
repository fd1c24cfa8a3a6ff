#!/usr/bin/env bash
# Start-up of a durable akerd with index = "hnsw" on GloVe (400,000 x 50, release build):
# the first start imports the .npy into data_dir, builds the graph and saves it beside
# checkpoint 0; the second loads that graph. Seconds from launch to "akerd: ready" for
# each, and the log lines saying what each did (built / loaded, the graph's dump time,
# which is also what a runtime checkpoint holds writers up for).
#   bash ops/durable-hnsw-start.sh [OUT]     outputs in OUT (bench/results/durable/hnsw-start)
#   DATA=dir                                 the data_dir (target/hnsw-start-data: ~0.4 GB)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/durable/hnsw-start}
data=${DATA:-target/hnsw-start-data}
port=${PORT:-7443}
[ -f data/glove-6b-50d.npy ] || bash ops/get-glove.sh
cargo build --release --bin akerd -q
mkdir -p "$out"
rm -rf "$data"
. ops/akerd-lib.sh
# A build of GloVe's graph takes minutes: wait up to 15.
export AKERD_READY_S=900
for start in first second; do
  cat > "$out/$start.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
executors = 1
[cache]
recall_floor = 0.0
[backend]
index = "hnsw"
data = { kind = "file", path = "$PWD/data/glove-6b-50d.npy" }
data_dir = "$PWD/$data"
[admin]
enabled = false
TOML
  t0=$(date +%s.%N)
  akerd_start "$out/$start.toml" "$out/$start.log"
  python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" \
    "$t0" "$(date +%s.%N)" > "$out/$start.seconds"
  akerd_stop
done
du -sb "$data" | cut -f1 > "$out/data.bytes"
for start in first second; do
  echo "$start start: $(cat "$out/$start.seconds") s to ready"
  grep -E "recovered|built|loaded|dumped|saved|checkpoint written" "$out/$start.log" | sed 's/^/  /'
done
echo "data_dir: $(cat "$out/data.bytes") bytes"
