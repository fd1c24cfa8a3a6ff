#!/usr/bin/env bash
# The end-to-end benchmark (loadgen issue): akerd on the embedded backend over GloVe
# with the paper's policy, replaying simZipf traces through the cache and with the
# cache bypassed, all in one run so the ratios compare like with like.
#
#   bash ops/e2e.sh [DURATION_S]      # results in target/e2e/
#
# Needs data/glove-6b-50d.npy (bash ops/get-glove.sh). Loopback only; every run is
# bounded by --duration and stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-20}
out=target/e2e
mkdir -p "$out"
[ -f data/glove-6b-50d.npy ] || bash ops/get-glove.sh
cargo build --release -q -p bench -p loadgen --bin akerd --bin aker-loadgen --bin bench 2>/dev/null \
  || cargo build --release -q -p bench -p loadgen -p aker

for skew in 0.99 0.30; do
  [ -f "$out/glove-$skew.trace" ] || ./target/release/bench trace --dataset glove --skew "$skew" \
      --out "$out/glove-$skew.trace" --base-out "$out/glove-base.fvecs"
done

cat > "$out/akerd.toml" <<TOML
[server]
listen = "127.0.0.1:7710"
executors = ${EXECUTORS:-2}
max_inflight = 128
[cache]
metric = "l2sq"
delta = 0
capacity_objects = 19950      # 5% of the collection, as in the paper's runs
policy = { kind = "aker", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }
[backend]
kind = "embedded"
index = "hnsw"
threads = 2
hnsw_m = 16
hnsw_ef_construction = 64
hnsw_ef_search = 128
data = { kind = "file", path = "$PWD/$out/glove-base.fvecs" }
[admin]
enabled = false
TOML

./target/release/akerd --config "$out/akerd.toml" > "$out/akerd.log" 2>&1 &
akerd=$!
trap 'kill $akerd 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  kill -0 $akerd 2>/dev/null || { cat "$out/akerd.log"; exit 1; }
  ./target/release/aker-loadgen -t 127.0.0.1:7710 --closed -c 1 -d 1 -D 1s -w 0s --mix search=100 \
      --vectors 1 -q >/dev/null 2>&1 && break
  sleep 1
done

lg() { ./target/release/aker-loadgen -t 127.0.0.1:7710 -c 8 -d 8 -w 3s -D "${dur}s" "$@"; }
# o: the cost every request pays (one vector, so all exact hits after the first)
lg --closed --mix search=100 --vectors 1 --json "$out/exact-only.json" | tee "$out/exact-only.txt"
for skew in 0.99 0.30; do
  t="$out/glove-$skew.trace"
  lg --closed --trace "$t" --loop --bypass --json "$out/bypass-$skew.json" | tee "$out/bypass-$skew.txt"
  lg --closed --trace "$t" --loop --flush --json "$out/cache-$skew.json" | tee "$out/cache-$skew.txt"
done
echo "results in $out"
