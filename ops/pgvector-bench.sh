#!/usr/bin/env bash
# aker in front of pgvector against pgvector alone, in one run (the paper's headline):
# GloVe (399,000 x 50) in PostgreSQL 18.6 + pgvector 0.8.6, the runner's simZipf 0.99 /
# 0.30 traces with exact ground truth, closed-loop throughput, latency and recall of
#   pg-*       the trace's searches as SQL straight into PostgreSQL (aker-loadgen --pg),
#              1 / 2 / 4 / 8 connections
#   bypass-*   through akerd with BYPASS_CACHE (akerd's own cost on every miss)
#   cache5-* / cache1-*   through akerd's cache, paper policy, pool 5% / 1% of the
#              collection in objects (flushed first)
#   exact-only all-exact-hit load through akerd: o of the cost bound
#   open50-* / open90-*   open loop at 50% / 90% of PostgreSQL alone's best throughput,
#              PostgreSQL alone and akerd (cache 5%) at the same intended rate: latency
#              from the intended send time on both sides
#   rep1-3-*   PostgreSQL alone (best connections) and akerd cache 5% again, three
#              times, REPEAT_S counted each: the run-to-run spread
# unconstrained (shared_buffers 512MB) and memory-constrained (PostgreSQL in a cgroup v1
# memory group of MEM_LIMIT_MB, shared_buffers 128kB: searches read from disk), plus
# writes through akerd against straight into PostgreSQL (unconstrained, the same rows).
#
#   bash ops/pgvector-bench.sh [DURATION_S [WARMUP_S]]   # results in target/pgbench/, summary.md
#   env: MEM_LIMIT_MB (100), SWEEP_MB ("130 180 200 300 400": PostgreSQL alone's extra
#   limits), REPEAT_S (30), SEARCH_RATE (400: searches/s beside the writes),
#   CACHE_POLICY (guarded: akerd's default policy and second-chance eviction; aker: the
#   paper's policy, FIFO), SETS ("free latency repeat writes mem": the parts to run),
#   PGBENCH_OUT (target/pgbench: a directory of an earlier run resumes it)
#
# Every search run replays the trace from its start: WARMUP_S uncounted (the cache fills;
# 20 s by default), then DURATION_S counted (10 s) as the trace goes on. In the
# memory-constrained set the warm-up runs without the limit, which is applied (and the
# page cache dropped) 2 s before counting starts, for PostgreSQL alone as for akerd: the
# cache is measured warm and the database cold, as in a deployment running for a while.
#
# Pinned: PostgreSQL on core 0 (taskset via ops/pg.sh's PG_CPUS), akerd and
# aker-loadgen on core 1, in every run. fsync = on, synchronous_commit = on (the
# defaults) everywhere. Loopback only; every run is bounded by its duration.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dur=${1:-10}
warm=${2:-20}
out=${PGBENCH_OUT:-$root/target/pgbench}
sets=" ${SETS:-free latency repeat writes mem} "
case ${CACHE_POLICY:-guarded} in
  guarded) cache_policy='policy = { kind = "guarded", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }
eviction = "second_chance"' ;;
  aker) cache_policy='policy = { kind = "aker", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }
eviction = "fifo"' ;;
  *) echo "CACHE_POLICY: guarded or aker" >&2; exit 2 ;;
esac
has_set() { [[ $sets == *" $1 "* ]]; }
data=$out/pgdata
port=${PGPORT_BENCH:-55440}
aport=7720
mem_mb=${MEM_LIMIT_MB:-100}
repeat_s=${REPEAT_S:-30}
search_rate=${SEARCH_RATE:-400}
cg=/sys/fs/cgroup/memory/aker-pgbench
mkdir -p "$out"
[ -f data/glove-6b-50d.npy ] || bash ops/get-glove.sh
cargo build --release -q -p bench -p loadgen -p aker
for skew in 0.99 0.30; do
  [ -f "$out/glove-$skew.trace" ] || ./target/release/bench trace --dataset glove --skew "$skew" \
      --out "$out/glove-$skew.trace" --base-out "$out/glove-base.fvecs"
done

url="postgresql://aker@127.0.0.1:$port/postgres"
pw="$data.password"
lg() { taskset -c 1 ./target/release/aker-loadgen "$@"; }
pgsql() { bash ops/pg.sh psql "$data" "$port" -qAt -c "$1"; }
pg_start() {  # SHARED_BUFFERS [cgroup]
  local sb=$1 group=${2:-}
  (
    if [ -n "$group" ]; then echo $BASHPID > "$group/cgroup.procs"; fi
    PG_CPUS=0 PG_SETTINGS="-c shared_buffers=$sb -c max_connections=50 -c fsync=on \
      -c synchronous_commit=on -c max_parallel_workers_per_gather=0 -c jit=off" \
      bash ops/pg.sh start "$data" "$port" $$ >/dev/null
  )
}
pg_stop() { bash ops/pg.sh stop "$data"; }
# Sectors read from the machine's disks (whole devices only: /sys/block).
disk_sectors() { { cat /sys/block/{vd,sd,nvme,xvd}*/stat 2>/dev/null || true; } | awk '{s += $3} END {print s + 0}'; }
# One sample of akerd's /metrics.
metric() {
  python3 - "$1" "$((aport + 1))" <<'PY'
import sys, urllib.request
name, port = sys.argv[1], sys.argv[2]
for line in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode().splitlines():
    if line.startswith(name + " "):
        print(line.split()[1]); break
PY
}
akerd=
akerd_start() {  # CONFIG LOG: akerd on core 1, back when it says ready
  taskset -c 1 ./target/release/akerd --config "$1" > "$2" 2>&1 &
  akerd=$!
  for _ in $(seq 1 120); do
    kill -0 $akerd 2>/dev/null || { tail -20 "$2"; exit 1; }
    grep -q "akerd: ready" "$2" && return 0
    sleep 1
  done
  echo "akerd did not get ready in 120 s ($2)" >&2; exit 1
}
akerd_stop() { kill $akerd; wait $akerd 2>/dev/null || true; akerd=; }
# PostgreSQL alone's best connection count and its throughput in set TAG at SKEW.
pg_best() {
  python3 - "$out" "$1" "$2" <<'PY'
import json, sys
out, tag, skew = sys.argv[1:]
runs = [(json.load(open(f"{out}/{tag}-pg-c{c}-{skew}.json"))["throughput"], c) for c in (1, 2, 4, 8)]
thr, c = max(runs)
print(c, int(thr))
PY
}
cleanup() {
  [ -n "$akerd" ] && kill "$akerd" 2>/dev/null || true
  bash ops/pg.sh stop "$data" 2>/dev/null || true
  [ -d "$cg" ] && rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT

# --- load and index (once) ------------------------------------------------------------
pg_start 512MB
pgsql "SELECT version()" > "$out/pg-version"
pgsql "SELECT extversion FROM pg_extension WHERE extname = 'vector'" >> "$out/pg-version"
if [ ! -f "$out/load.json" ]; then
  lg --pg "$url" --pg-password-file "$pw" --pg-table items --pg-load "$out/glove-base.fvecs" \
     --pg-index 16:64 --json "$out/load.json" > "$out/load.txt"
fi
cat "$out/load.json"

# --- hnsw.ef_search for recall@10 of about 0.9 without a cache, per skew ---------------
for skew in 0.99 0.30; do
  [ -f "$out/ef-$skew" ] && continue
  pick=
  for ef in 40 64 100 160 250 400 640 1000; do
    lg --pg "$url" --pg-password-file "$pw" --pg-table items --pg-ef $ef \
       --trace "$out/glove-$skew.trace" --closed --loop -c 2 -w 1s -D 3s \
       --json "$out/tune-$skew-ef$ef.json" > /dev/null 2>&1
    rec=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['recall'])" "$out/tune-$skew-ef$ef.json")
    echo "skew $skew ef $ef recall $rec"
    if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.895 else 1)" "$rec"; then pick=$ef; break; fi
  done
  echo "${pick:-1000}" > "$out/ef-$skew"
done

# The memory limit is lifted for a run's warm-up and applied before it counts (mem set).
limit_set() { [ -n "${limit_group:-}" ] && echo "$1" > "$limit_group/memory.limit_in_bytes" || true; }
constrain_later() {  # applied 2 s before the counted part of a run that starts now
  cpid=
  [ -n "${limit_group:-}" ] || return 0
  [ "$warm" -ge 4 ] || { echo "WARMUP_S must be at least 4 for the memory-constrained set" >&2; exit 1; }
  local bytes=${1:-$((mem_mb * 1024 * 1024))}
  (
    sleep $((warm - 2)); limit_set "$bytes"; sync; echo 3 > /proc/sys/vm/drop_caches
    got=$(cat "$limit_group/memory.limit_in_bytes")
    # The kernel rounds to pages; a limit that did not take leaves it unlimited.
    [ "$got" -le "$bytes" ] || echo "limit $bytes not applied (reads $got)" > "$out/LIMIT-FAILED"
  ) &
  cpid=$!
}
constrained_wait() {
  [ -n "${cpid:-}" ] && wait "$cpid" 2>/dev/null
  cpid=
  if [ -f "$out/LIMIT-FAILED" ]; then cat "$out/LIMIT-FAILED" >&2; exit 1; fi
}
unconstrain() { limit_set -1; }

# --- one configuration: PostgreSQL alone, akerd bypass / cache 5% / cache 1% ------------
run_set() {  # TAG
  local tag=$1
  for skew in 0.99 0.30; do
    local ef; ef=$(cat "$out/ef-$skew") t="$out/glove-$skew.trace"
    for c in 1 2 4 8; do
      # (A run whose JSON is there is kept: a stopped script resumes where it was.)
      [ -f "$out/$tag-pg-c$c-$skew.json" ] && continue
      unconstrain; constrain_later
      r0=$(disk_sectors)
      lg --pg "$url" --pg-password-file "$pw" --pg-table items --pg-ef "$ef" --trace "$t" \
         --closed --loop -c $c -w "${warm}s" -D "${dur}s" --json "$out/$tag-pg-c$c-$skew.json" > /dev/null
      constrained_wait
      echo "{\"disk_read_sectors\": $(( $(disk_sectors) - r0 ))}" > "$out/$tag-pg-c$c-$skew.mem.json"
    done
    # akerd's pool gets PostgreSQL alone's best connection count (this set, this skew).
    read -r best _ < <(pg_best "$tag" "$skew")
    for pool in 5 1; do
      [ -f "$out/$tag-cache$pool-$skew.mem.json" ] && continue
      objects=$(( 399000 * pool / 100 ))
      cat > "$out/$tag-akerd-$skew-$pool.toml" <<TOML
[server]
listen = "127.0.0.1:$aport"
executors = 1
inflight_max = 128
request_timeout_ms = 60000
[cache]
k_max = 10
delta = 0
capacity_objects = $objects
$cache_policy
[backend]
kind = "pgvector"
threads = $best
[backend.pgvector]
url = "$url"
password_file = "$pw"
table = "items"
ef_search = $ef
[admin]
enabled = true
listen = "127.0.0.1:$((aport + 1))"
TOML
      akerd_start "$out/$tag-akerd-$skew-$pool.toml" "$out/$tag-akerd-$skew-$pool.log"
      al() { lg -t 127.0.0.1:$aport -c 8 -d 8 -w "${warm}s" -D "${dur}s" -q "$@"; }
      if [ $pool = 5 ]; then
        lg -t 127.0.0.1:$aport -c 8 -d 8 -w 2s -D "${dur}s" -q --closed --mix search=100 \
           --vectors 2 --json "$out/$tag-exact-only-$skew.json" > /dev/null
        unconstrain; constrain_later
        al --closed --trace "$t" --loop --bypass --json "$out/$tag-bypass-$skew.json" > /dev/null
        constrained_wait
      fi
      unconstrain; constrain_later
      r0=$(disk_sectors)
      b0=$(pgsql "SELECT blks_read FROM pg_stat_database WHERE datname = 'postgres'")
      al --closed --trace "$t" --loop --flush --json "$out/$tag-cache$pool-$skew.json" > /dev/null
      constrained_wait
      r1=$(disk_sectors)
      b1=$(pgsql "SELECT blks_read FROM pg_stat_database WHERE datname = 'postgres'")
      rss=$(awk '/VmRSS/{print $2}' /proc/$akerd/status)
      pool_bytes=$(metric aker_pool_bytes)
      echo "{\"rss_kb\": $rss, \"pool_bytes\": ${pool_bytes:-null}, \"disk_read_sectors\": $((r1 - r0)), \"blks_read\": $((b1 - b0))}" \
          > "$out/$tag-cache$pool-$skew.mem.json"
      akerd_stop
    done
    # Equal memory: PostgreSQL alone given the limit plus akerd's resident memory.
    if [ -n "${limit_group:-}" ] && [ ! -f "$out/$tag-eq-pg-$skew.json" ]; then
      rss_kb=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['rss_kb'])" "$out/$tag-cache5-$skew.mem.json")
      unconstrain; constrain_later $((mem_mb * 1024 * 1024 + rss_kb * 1024))
      lg --pg "$url" --pg-password-file "$pw" --pg-table items --pg-ef "$ef" --trace "$t" \
         --closed --loop -c "$best" -w "${warm}s" -D "${dur}s" --json "$out/$tag-eq-pg-$skew.json" > /dev/null
      constrained_wait
      echo "{\"limit_bytes\": $((mem_mb * 1024 * 1024 + rss_kb * 1024))}" > "$out/$tag-eq-pg-$skew.mem.json"
    fi
    # The memory PostgreSQL alone needs for akerd's throughput: its rate at larger limits.
    for sweep_mb in ${SWEEP_MB:-130 180 200 300 400}; do
      [ -n "${limit_group:-}" ] || break
      [ -f "$out/$tag-sweep$sweep_mb-pg-$skew.json" ] && continue
      unconstrain; constrain_later $((sweep_mb * 1024 * 1024))
      lg --pg "$url" --pg-password-file "$pw" --pg-table items --pg-ef "$ef" --trace "$t" \
         --closed --loop -c "$best" -w "${warm}s" -D "${dur}s" --json "$out/$tag-sweep$sweep_mb-pg-$skew.json" > /dev/null
      constrained_wait
    done
  done
}

# --- open loop at equal rates: latency that compares (unconstrained) -------------------
# The same intended rates for PostgreSQL alone (its best connection count) and akerd
# (cache 5%, 8 x 8): 50% and 90% of PostgreSQL alone's best closed-loop throughput.
latency_set() {
  for skew in 0.99 0.30; do
    local ef best thr t="$out/glove-$skew.trace"
    ef=$(cat "$out/ef-$skew")
    read -r best thr < <(pg_best free "$skew")
    for pct in 50 90; do
      [ -f "$out/free-open$pct-pg-$skew.json" ] && continue
      lg --pg "$url" --pg-password-file "$pw" --pg-table items --pg-ef "$ef" --trace "$t" \
         --rate $((thr * pct / 100)) --loop -c "$best" -w "${warm}s" -D "${dur}s" \
         --json "$out/free-open$pct-pg-$skew.json" > /dev/null
    done
    [ -f "$out/free-open90-cache5-$skew.json" ] && continue
    akerd_start "$out/free-akerd-$skew-5.toml" "$out/free-open-akerd-$skew.log"
    for pct in 50 90; do
      lg -t 127.0.0.1:$aport -c 8 -d 8 -w "${warm}s" -D "${dur}s" -q --rate $((thr * pct / 100)) \
         --trace "$t" --loop --flush --json "$out/free-open$pct-cache5-$skew.json" > /dev/null
    done
    akerd_stop
  done
}

# --- the headline pair three times more, REPEAT_S counted: the spread between runs -------
repeat_set() {
  for skew in 0.99 0.30; do
    local ef best t="$out/glove-$skew.trace"
    ef=$(cat "$out/ef-$skew")
    read -r best _ < <(pg_best free "$skew")
    [ -f "$out/free-rep3-cache5-$skew.json" ] && continue
    akerd_start "$out/free-akerd-$skew-5.toml" "$out/free-rep-akerd-$skew.log"
    for rep in 1 2 3; do
      lg --pg "$url" --pg-password-file "$pw" --pg-table items --pg-ef "$ef" --trace "$t" \
         --closed --loop -c "$best" -w "${warm}s" -D "${repeat_s}s" \
         --json "$out/free-rep$rep-pg-$skew.json" > /dev/null
      lg -t 127.0.0.1:$aport -c 8 -d 8 -w "${warm}s" -D "${repeat_s}s" -q --closed --trace "$t" \
         --loop --flush --json "$out/free-rep$rep-cache5-$skew.json" > /dev/null
    done
    akerd_stop
  done
}

# --- unconstrained (in a memory group without a limit, to read its peak) ----------------
pg_stop
cgf=/sys/fs/cgroup/memory/aker-pgbench-free
mkdir -p "$cgf"
sync; echo 3 > /proc/sys/vm/drop_caches   # so what it reads is charged to its group
pg_start 512MB "$cgf"
# A warm database, as one that has served for a while: table and index read into shared
# buffers (and the page cache) before any run, so no unconstrained run reads from disk.
pgsql "CREATE EXTENSION IF NOT EXISTS pg_prewarm" > /dev/null
pgsql "SELECT sum(pg_prewarm(c.oid)) FROM pg_class c WHERE c.oid = 'items'::regclass
       OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'items'::regclass)" \
    > "$out/free-prewarm-blocks"
has_set free && run_set free
has_set latency && latency_set
has_set repeat && repeat_set
cat "$cgf/memory.max_usage_in_bytes" > "$out/free-cgroup-max-usage"

# --- writes: through akerd against straight into PostgreSQL, the same GloVe rows --------
if has_set writes && [ ! -f "$out/search-while-writes.json" ]; then
  n_w=3000
  lg --pg "$url" --pg-password-file "$pw" --pg-table items --pg-writes "$out/glove-base.fvecs" \
     --pg-writes-n $n_w -c 4 --id-base 10000000 --json "$out/writes-pg.json" > /dev/null
  akerd_start "$out/free-akerd-0.99-5.toml" "$out/writes-akerd.log"
  # Half inserts, half deletes of what this run inserted, 4 connections 1 deep.
  lg -t 127.0.0.1:$aport -c 4 -d 1 -w 1s -D "${dur}s" -q --closed --mix insert=50,delete=50 \
     --vectors $n_w --vectors-from "$out/glove-base.fvecs" --id-base 20000000 \
     --json "$out/writes-akerd.json" > /dev/null
  # Searches (the 0.99 trace, warm cache) with and without 100 writes/s beside them, open
  # loop at SEARCH_RATE (400/s: half of what akerd serves closed loop), so p99 is latency.
  lg -t 127.0.0.1:$aport -c 8 -d 8 -w "${warm}s" -D "${dur}s" -q --rate "$search_rate" \
     --trace "$out/glove-0.99.trace" --loop --flush --json "$out/search-no-writes.json" > /dev/null
  lg -t 127.0.0.1:$aport -c 2 -d 1 -w "${warm}s" -D "${dur}s" -q --rate 100 --mix insert=50,delete=50 \
     --vectors $n_w --vectors-from "$out/glove-base.fvecs" --id-base 30000000 \
     --json "$out/writes-beside.json" > /dev/null &
  wl=$!
  lg -t 127.0.0.1:$aport -c 8 -d 8 -w "${warm}s" -D "${dur}s" -q --rate "$search_rate" \
     --trace "$out/glove-0.99.trace" --loop --flush --json "$out/search-while-writes.json" > /dev/null
  wait $wl || true
  akerd_stop
fi
# The writes leave rows (and dead index entries) behind: the table as loaded again.
pgsql "DELETE FROM items WHERE id >= 399000" > /dev/null
pgsql "VACUUM ANALYZE items" > /dev/null
[ "$(pgsql "SELECT count(*) FROM items")" = 399000 ] || { echo "items is not the loaded table" >&2; exit 1; }
pg_stop
rmdir "$cgf" 2>/dev/null || true

# --- memory-constrained: PostgreSQL's processes and page cache limited ------------------
if has_set mem; then
  mkdir -p "$cg"
  sync; echo 3 > /proc/sys/vm/drop_caches
  pg_start 128kB "$cg"
  limit_group=$cg
  run_set mem
  echo $((mem_mb * 1024 * 1024)) > "$out/mem-cgroup-limit"
  cat "$cg/memory.failcnt" > "$out/mem-cgroup-failcnt"

  pg_stop
  rmdir "$cg" 2>/dev/null || true
fi

py=python3
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import matplotlib' 2>/dev/null; then py=.venv/bin/python; fi
$py ops/pgvector_summary.py "$out" | tee "$out/summary.md"
