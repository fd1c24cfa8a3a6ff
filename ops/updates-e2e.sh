#!/usr/bin/env bash
# The cache under updates end to end (#28): akerd over GloVe's collection (exact
# embedded store, so recall against the backend is true recall), three traces per write
# share from `bench updates --traces` replayed by aker-loadgen in order against one
# akerd: the simZipf 0.99 stream as a warm-up (ground truth: the collection), the stream
# again with inserts of held-out vectors and deletes mixed in (WRITES shares of the
# operations; no ground truth, the collection changes under it: open loop at RATE ops/s,
# write latency under load), and the stream once more, read-only, with ground truth as
# of after those writes. Per akerd configuration (paper-Aker with Δ 10, FIFO, no floor; and
# akerd's defaults: guarded, Δ 2, second chance, recall floor 0.95), pool 1% of the
# collection in objects. Read-only phases closed loop, 8 connections x depth 8; akerd on cores 0-1
# (1 executor, 2 backend threads), loadgen pinned to core 1; loopback only; every phase
# ends with its trace.
#   bash ops/updates-e2e.sh            # results in target/updates-e2e/ (summary.md)
#   env: REQUESTS (20000 searches per phase), WRITES ("1% 10%"), RATE (250 ops/s in the
#   writes phase), CONFIGS ("paper default"), OUT
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/target/updates-e2e}
requests=${REQUESTS:-20000}
writes=${WRITES:-1% 10%}
rate=${RATE:-250}
mkdir -p "$out"
cargo build --release -q -p aker -p loadgen -p bench
[ -f data/glove-6b-50d.npy ] || bash ops/get-glove.sh
shares=$(echo "$writes" | tr ' ' ',')
./target/release/bench updates --dataset glove --requests "$requests" \
  --traces "$out" --trace-writes "$shares" | tee "$out/traces.txt"
collection=$(python3 -c "import struct,os;p='$out/glove-collection.fvecs';d=struct.unpack('<i',open(p,'rb').read(4))[0];print(os.path.getsize(p)//(4+4*d))")
pool=$(( (collection + 50) / 100 ))
port=7760
. ops/akerd-lib.sh
declare -A cache=(
  [paper]='delta = 10
policy = { kind = "aker", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }
eviction = "fifo"
filter_candidates = 1
recall_floor = 0'
  [default]='delta = 2'
)
for c in ${CONFIGS:-paper default}; do
  for w in $writes; do
    pct="${w%\%}pct"
    name=$c-$pct
    cat > "$out/$name.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
executors = 1
request_timeout_ms = 60000
[cache]
k_max = 10
capacity_objects = $pool
snapshot_load = false
snapshot_on_shutdown = false
${cache[$c]}
[backend]
index = "exact"
threads = 2
data = { kind = "file", path = "$out/glove-collection.fvecs" }
[admin]
enabled = true
listen = "127.0.0.1:$((port + 1))"
TOML
    akerd_start "$out/$name.toml" "$out/$name.log" 0-1
    for phase in warm writes replay; do
      trace="$out/glove-$phase-$pct.trace"
      [ "$phase" = warm ] && trace="$out/glove-warm.trace"
      # Read-only phases closed loop (throughput, recall); the writes open loop at RATE,
      # below saturation, so write latency is the writes' own and not the queue's.
      mode=(--closed)
      [ "$phase" = writes ] && mode=(-r "$rate")
      taskset -c 1 ./target/release/aker-loadgen -t 127.0.0.1:$port -q -c 8 -d 8 "${mode[@]}" \
        --trace "$trace" -w 0s -D 600s --json "$out/$name-$phase.json" > /dev/null
      curl -s "http://127.0.0.1:$((port + 1))/metrics" > "$out/$name-$phase.metrics" || true
    done
    akerd_stop
  done
done
python3 ops/updates_e2e_summary.py "$out" | tee "$out/summary.md"
