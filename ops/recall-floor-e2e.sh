#!/usr/bin/env bash
# The recall floor end to end (#23): akerd over GloVe (399,000 x 50, exact embedded
# store, so recall against the backend is true recall), the runner's simZipf 0.99 trace
# with exact ground truth replayed by aker-loadgen, open loop at RATE searches/s (the
# backend keeps spare time for the checks), then closed loop (the checks' cost in
# throughput: under saturation they find no spare time). Pool 5% of the collection in
# objects. Per policy (paper-Aker, akerd's default guarded) and floor (off, 0.95, 0.98):
# loadgen's recall@10 and hit ratio against akerd's own estimate, its state, threshold
# scale and checks. akerd on cores 0-1 (1 executor, 2 backend threads), loadgen pinned
# to core 1; loopback only; every run bounded by its duration.
#   bash ops/recall-floor-e2e.sh [DURATION_S [WARMUP_S]]   # results in target/floor-e2e/
#   env: RATE (600), TRACE (target/pgbench/glove-0.99.trace), BASE (its .fvecs),
#   POLICIES ("aker guarded"), OUT (target/floor-e2e)
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-40}
warm=${2:-20}
rate=${RATE:-600}
out=${OUT:-$PWD/target/floor-e2e}
trace=${TRACE:-$PWD/target/pgbench/glove-0.99.trace}
base=${BASE:-$PWD/target/pgbench/glove-base.fvecs}
mkdir -p "$out"
cargo build --release -q -p aker -p loadgen -p bench
if [ ! -f "$trace" ]; then
  [ -f data/glove-6b-50d.npy ] || bash ops/get-glove.sh
  ./target/release/bench trace --dataset glove --skew 0.99 --out "$trace" --base-out "$base"
fi
port=7740
. ops/akerd-lib.sh
declare -A policy=(
  [aker]='{ kind = "aker", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }'
  [guarded]='{ kind = "guarded", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }'
)
declare -A eviction=([aker]=fifo [guarded]=second_chance)
# Δ: the paper configuration's 0 for paper-Aker, akerd's default 2 for guarded.
declare -A delta=([aker]=0 [guarded]=2)
for p in ${POLICIES:-aker guarded}; do
  for floor in 0 0.95 0.98; do
    name=$p-floor$floor
    cat > "$out/$name.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
executors = 1
request_timeout_ms = 60000
[cache]
k_max = 10
delta = ${delta[$p]}
capacity_objects = 19950
policy = ${policy[$p]}
eviction = "${eviction[$p]}"
recall_floor = $floor
[backend]
index = "exact"
threads = 2
data = { kind = "file", path = "$base" }
[admin]
enabled = true
listen = "127.0.0.1:$((port + 1))"
TOML
    akerd_start "$out/$name.toml" "$out/$name.log"
    taskset -c 1 ./target/release/aker-loadgen -t 127.0.0.1:$port -q -c 8 -d 8 -r "$rate" \
      --trace "$trace" --loop -w "${warm}s" -D "${dur}s" --json "$out/$name-open.json" > /dev/null
    curl -s "http://127.0.0.1:$((port + 1))/metrics" > "$out/$name-open.metrics" || true
    taskset -c 1 ./target/release/aker-loadgen -t 127.0.0.1:$port -q -c 8 -d 8 --closed \
      --trace "$trace" --loop -w 5s -D 20s --json "$out/$name-closed.json" > /dev/null
    curl -s "http://127.0.0.1:$((port + 1))/metrics" > "$out/$name-closed.metrics" || true
    akerd_stop
  done
done
python3 ops/recall_floor_e2e_summary.py "$out" | tee "$out/summary.md"
