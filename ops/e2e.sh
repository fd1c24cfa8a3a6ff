#!/usr/bin/env bash
# The end-to-end benchmark (loadgen issue): akerd on the embedded backend over GloVe
# with the paper's policy, replaying simZipf traces through the cache and with the
# cache bypassed, all in one run so the ratios compare like with like.
#
#   bash ops/e2e.sh [DURATION_S]      # results in target/e2e/, summary in target/e2e/summary.md
#
# For each configuration EXECUTORS:NICE in CONFIGS (default "2:10 1:10 2:0 2:idle":
# executor count, nice value of the backend threads or `idle` for SCHED_IDLE) it starts
# akerd, then runs closed-loop (maximum throughput):
#   exact-only  two vectors, so every request after the first two is an exact hit: o
#   bypass-S    the skew-S trace with BYPASS_CACHE: o + b
#   cache-S     the same trace through the cache (flushed first): hit ratio h
# and open-loop runs at 50/70/90% of cache-S's maximum for the latency-throughput curve
# (the first configuration; later ones with 2 executors: 70% only, to compare).
# ops/e2e_summary.py turns the JSON into the tables.
#
# Needs data/glove-6b-50d.npy (bash ops/get-glove.sh). Loopback only; every run is
# bounded by --duration and stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-20}
out=target/e2e
port=7710
mkdir -p "$out"
[ -f data/glove-6b-50d.npy ] || bash ops/get-glove.sh
cargo build --release -q -p bench -p loadgen -p aker

for skew in 0.99 0.30; do
  [ -f "$out/glove-$skew.trace" ] || ./target/release/bench trace --dataset glove --skew "$skew" \
      --out "$out/glove-$skew.trace" --base-out "$out/glove-base.fvecs"
done

if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
  echo "something already listens on 127.0.0.1:$port (a leftover akerd?); stop it first" >&2
  exit 1
fi

lg() { ./target/release/aker-loadgen -t 127.0.0.1:$port -c 8 -d 8 -w 3s -D "${dur}s" -q "$@"; }
akerd=
trap '[ -n "$akerd" ] && kill $akerd 2>/dev/null || true' EXIT
first=1
for conf in ${CONFIGS:-2:10 1:10 2:0 2:idle}; do
  ex=${conf%%:*}; nice=${conf##*:}; p="$out/ex$ex-nice$nice"
  idle=false; if [ "$nice" = idle ]; then idle=true; nice=0; p="$out/ex$ex-niceidle"; fi
  cat > "$p.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
executors = $ex
inflight_max = 128
[cache]
metric = "l2sq"
delta = 0
capacity_objects = 19950      # 5% of the collection, as in the paper's runs
policy = { kind = "aker", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }
[backend]
kind = "embedded"
index = "hnsw"
threads = 2
nice = $nice
idle = $idle
hnsw_m = 16
hnsw_ef_construction = 64
hnsw_ef_search = 128
data = { kind = "file", path = "$PWD/$out/glove-base.fvecs" }
[admin]
enabled = false
TOML
  ./target/release/akerd --config "$p.toml" > "$p.log" 2>&1 &
  akerd=$!
  ready=0
  for _ in $(seq 1 900); do
    kill -0 $akerd 2>/dev/null || { tail -20 "$p.log"; exit 1; }
    if grep -q "akerd: ready" "$p.log"; then ready=1; break; fi
    sleep 1
  done
  [ $ready = 1 ] || { echo "akerd did not become ready" >&2; exit 1; }

  lg --closed --mix search=100 --vectors 2 --json "$p-exact-only.json" | tee "$p-exact-only.txt"
  for skew in 0.99 0.30; do
    t="$out/glove-$skew.trace"
    lg --closed --trace "$t" --loop --bypass --json "$p-bypass-$skew.json" | tee "$p-bypass-$skew.txt"
    lg --closed --trace "$t" --loop --flush --json "$p-cache-$skew.json" | tee "$p-cache-$skew.txt"
    if [ $first = 1 ]; then loads="50 70 90"; elif [ "$ex" = 2 ]; then loads=70; else loads=; fi
    max=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['run']['throughput'])" "$p-cache-$skew.json")
    for pct in $loads; do
      rate=$(python3 -c "print(round($max * $pct / 100))")
      lg --rate "$rate" --trace "$t" --loop --flush --json "$p-open$pct-$skew.json" | tee "$p-open$pct-$skew.txt"
    done
  done
  kill $akerd; wait $akerd 2>/dev/null || true; akerd=
  first=0
done
python3 ops/e2e_summary.py "$out" | tee "$out/summary.md"
