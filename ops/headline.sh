#!/usr/bin/env bash
# The headline (issue #42): akerd in front of pgvector against pgvector alone, as
# alternated pairs from the same database state, with what bounds the gain beside each:
#   skew 0.99, ROUNDS rounds of   pg (PostgreSQL alone) / bypass (every search a miss
#                                 through akerd) / cache (akerd's cache, pool 5%)
#   skew 0.30, ROUNDS rounds of   pg / cache
#   hardware: nothing pinned, 2 rounds of PostgreSQL alone at 4 and 8 connections and
#             akerd (cache 5%): the comparison a user with one machine makes
#   memory:   PostgreSQL in a cgroup v1 memory group (shared_buffers 128kB, so searches
#             read from the page cache inside the limit or from disk), 3 rounds of akerd
#             (cache 5%, PostgreSQL limited to MEM_LIMIT_MB) and PostgreSQL alone
#             limited to MEM_LIMIT_MB plus that round's akerd resident memory
# Each run: WARMUP_S uncounted (the trace from its start; akerd's cache fills), then
# DURATION_S counted. akerd runs its defaults but for what the comparison fixes: one
# executor, backend.threads = CONNS (PostgreSQL alone's connections), k_max 10, Δ 0
# (DELTA), pool 5% of the collection in objects. The change stream follows
# (wal_level = logical), as shipped. akerd's /metrics are read when counting starts and
# when it ends: the database searches per request (misses + recall checks) of the
# counted part. Pinned sets: PostgreSQL on core 0, akerd and aker-loadgen on core 1.
# Before every round: VACUUM ANALYZE, CHECKPOINT, table and index prewarmed, autovacuum
# off (as ops/miss-parity.sh). The data, traces and ef_search come from
# ops/pgvector-bench.sh (run here with SETS=none).
#
#   bash ops/headline.sh [ROUNDS (5)] [DURATION_S (30)] [WARMUP_S (20)]
#   env: SETS ("0.99 0.30 hardware memory"), CONNS (4), DELTA (0), MEM_LIMIT_MB (100),
#        MEM_WARMUP_S (120: the memory set's warm-up; with shared_buffers 128kB the
#        database is ~3x slower even before the limit, so 20 s leave the cache cold),
#        PGBENCH_OUT (target/pgbench), OUT (target/headline)
#   python3 ops/headline_summary.py target/headline   # summary.md and headline.json
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
dur=${2:-30}
warm=${3:-20}
sets=" ${SETS:-0.99 0.30 hardware memory} "
conns=${CONNS:-4}
delta=${DELTA:-0}
mem_mb=${MEM_LIMIT_MB:-100}
mem_warm=${MEM_WARMUP_S:-120}
src=${PGBENCH_OUT:-$PWD/target/pgbench}
out=${OUT:-$PWD/target/headline}
mkdir -p "$out"
source ops/pgbench-lib.sh
pgbench_prepare
source ops/akerd-lib.sh
aport=7740
pool_objects=$((399000 * 5 / 100))
v1=/sys/fs/cgroup/memory
cg=$v1/aker-headline
pg_start() {  # SHARED_BUFFERS CPUS(empty: not pinned) [GROUP]
  (
    if [ -n "${3:-}" ]; then echo $BASHPID > "$3/cgroup.procs"; fi
    PG_CPUS=$2 PG_SETTINGS="-c shared_buffers=$1 -c max_connections=50 -c fsync=on \
      -c synchronous_commit=on -c max_parallel_workers_per_gather=0 -c jit=off \
      -c autovacuum=off -c wal_level=logical" \
      bash ops/pg.sh start "$data" "$port" $$ > /dev/null
  )
  pgsql "CREATE EXTENSION IF NOT EXISTS pg_prewarm" > /dev/null
}
pg_stop() {
  # The change stream's slot (instance "headline") would hold WAL once akerd is gone.
  local cfg
  cfg=$(ls "$out"/*.toml 2>/dev/null | head -1)
  [ -z "$cfg" ] || ./target/release/akerd --config "$cfg" --drop-slot > /dev/null 2>&1 || true
  bash ops/pg.sh stop "$data"
  sleep 1
}
cleanup() {
  akerd_cleanup
  bash ops/pg.sh stop "$data" 2>/dev/null || true
  rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT
metrics() { python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" \
  "http://127.0.0.1:$((aport + 1))/metrics"; }

# Each run's warm-up: WARMUP_S, the memory set's MEM_WARMUP_S.
run_warm=$warm
# The memory set's limit: lifted for a run's warm-up, applied (page cache dropped) 2 s
# before it counts, so the cache is measured warm and the database cold.
limited=
limit_later() {  # BYTES
  limit_pid=
  [ -n "$limited" ] || return 0
  echo -1 > "$cg/memory.limit_in_bytes"
  (
    sleep $((run_warm - 2)); echo "$1" > "$cg/memory.limit_in_bytes"; sync
    echo 3 > /proc/sys/vm/drop_caches
    [ "$(cat "$cg/memory.limit_in_bytes")" -le "$1" ] || echo "limit $1 not applied" > "$out/LIMIT-FAILED"
  ) &
  limit_pid=$!
}
limit_wait() {
  [ -z "${limit_pid:-}" ] || wait "$limit_pid"
  if [ -f "$out/LIMIT-FAILED" ]; then cat "$out/LIMIT-FAILED" >&2; exit 1; fi
}

# PostgreSQL alone: NAME SKEW CONNECTIONS CPUS [LIMIT_BYTES]
pg_run() {
  local name=$1 skew=$2 c=$3 cpus=$4 pin=()
  [ -z "$cpus" ] || pin=(taskset -c "$cpus")
  limit_later "${5:-0}"
  "${pin[@]}" ./target/release/aker-loadgen --pg "$url" --pg-password-file "$pw" --pg-table items \
    --pg-ef "$(cat "$src/ef-$skew")" --trace "$src/glove-$skew.trace" --closed --loop -c "$c" \
    -w "${run_warm}s" -D "${dur}s" --json "$out/$name.json" > /dev/null
  limit_wait
  echo "$(date -u +%FT%TZ) $name done" >&2
}

# Through akerd: NAME SKEW MODE(cache|bypass) CPUS [LIMIT_BYTES]
akerd_run() {
  local name=$1 skew=$2 mode=$3 cpus=$4 pin=()
  [ -z "$cpus" ] || pin=(taskset -c "$cpus")
  cat > "$out/$name.toml" <<TOML
[server]
listen = "127.0.0.1:$aport"
executors = 1
inflight_max = 128
request_timeout_ms = 60000
[cache]
k_max = 10
delta = $delta
capacity_objects = $pool_objects
[backend]
kind = "pgvector"
threads = $conns
[backend.pgvector]
url = "$url"
password_file = "$pw"
table = "items"
ef_search = $(cat "$src/ef-$skew")
instance = "headline"
[admin]
enabled = true
listen = "127.0.0.1:$((aport + 1))"
TOML
  akerd_start "$out/$name.toml" "$out/$name.log" "$cpus"
  local rss_empty_kb
  rss_empty_kb=$(awk '/VmRSS/{print $2}' "/proc/$akerd/status")
  limit_later "${5:-0}"
  (sleep "$run_warm"; metrics > "$out/$name.metrics0") &
  local m0=$!
  local how=--flush
  [ "$mode" = cache ] || how=--bypass
  "${pin[@]}" ./target/release/aker-loadgen -t "127.0.0.1:$aport" -c 8 -d 8 -w "${run_warm}s" \
    -D "${dur}s" -q --closed --trace "$src/glove-$skew.trace" --loop "$how" \
    --json "$out/$name.json" > /dev/null
  metrics > "$out/$name.metrics1"
  wait "$m0"
  limit_wait
  local rss_kb
  rss_kb=$(awk '/VmRSS/{print $2}' "/proc/$akerd/status")
  echo "{\"rss_empty_kb\": $rss_empty_kb, \"rss_kb\": $rss_kb}" > "$out/$name.mem.json"
  akerd_stop
  echo "$(date -u +%FT%TZ) $name done" >&2
}

git rev-parse --short HEAD > "$out/commit"
{ echo "rounds=$rounds dur=$dur warm=$warm conns=$conns delta=$delta mem_mb=$mem_mb mem_warm=$mem_warm pool_objects=$pool_objects"
  echo "ef_0.99=$(cat "$src/ef-0.99") ef_0.30=$(cat "$src/ef-0.30")"; } > "$out/setup"

# --- pinned, unconstrained: the pairs ----------------------------------------------------
if [[ $sets == *" 0.99 "* || $sets == *" 0.30 "* ]]; then
  pg_start 512MB 0
  for skew in 0.99 0.30; do
    [[ $sets == *" $skew "* ]] || continue
    for r in $(seq "$rounds"); do
      quiesce; pg_run "pg-$skew-r$r" "$skew" "$conns" 1
      if [ "$skew" = 0.99 ]; then quiesce; akerd_run "bypass-$skew-r$r" "$skew" bypass 1; fi
      quiesce; akerd_run "cache-$skew-r$r" "$skew" cache 1
    done
  done
  pg_stop
fi

# --- nothing pinned: one machine's comparison ----------------------------------------------
if [[ $sets == *" hardware "* ]]; then
  pg_start 512MB ""
  for r in 1 2; do
    for c in 4 8; do quiesce; pg_run "hw-pg-c$c-r$r" 0.99 "$c" ""; done
    quiesce; akerd_run "hw-cache-r$r" 0.99 cache ""
  done
  pg_stop
fi

# --- memory-constrained: equal memory -------------------------------------------------------
if [[ $sets == *" memory "* ]]; then
  [ -w "$v1" ] || { echo "the memory set needs the cgroup v1 memory controller at $v1" >&2; exit 2; }
  mkdir -p "$cg"
  sync; echo 3 > /proc/sys/vm/drop_caches
  pg_start 128kB 0 "$cg"
  limited=1
  run_warm=$mem_warm
  limit=$((mem_mb << 20))
  for r in 1 2 3; do
    quiesce; akerd_run "mem-cache-r$r" 0.99 cache 1 "$limit"
    rss_kb=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['rss_kb'])" "$out/mem-cache-r$r.mem.json")
    echo "{\"limit_bytes\": $((limit + rss_kb * 1024))}" > "$out/mem-pg-r$r.mem.json"
    quiesce; pg_run "mem-pg-r$r" 0.99 "$conns" 1 $((limit + rss_kb * 1024))
  done
  cat "$cg/memory.failcnt" > "$out/mem-cgroup-failcnt"
  limited=
  run_warm=$warm
  echo -1 > "$cg/memory.limit_in_bytes"
  pg_stop
fi
python3 ops/headline_summary.py "$out" | tee "$out/summary.md"
