#!/usr/bin/env bash
# akerd following PostgreSQL's changes (#40), two figures on GloVe (399,000 x 50) in
# PostgreSQL 18.6 + pgvector 0.8.6 with wal_level = logical:
#   1. the warm restart in front of PostgreSQL: the runner's simZipf 0.99 trace, its
#      first WARM_OPS searches warm the cache, the next 10,000 are measured (hit ratio,
#      recall@10) by an akerd that never restarted, one restarted warm (SIGTERM writes
#      the snapshot and holds the slot; the start restores it and replays the changes
#      made while it was down: DOWN_DELETES rows deleted by SQL) and one restarted cold
#      (cache.snapshot_load = false);
#   2. the change stream's lag (commit to applied, p50 / p99) and akerd's searches/s while
#      PostgreSQL takes SQL writes (50% inserts of new rows near existing ones, 50%
#      deletes of those) at 10%, 50% and 90% of the rate it sustains here, and without
#      writes (aker-changes, loadgen/README.md).
# Pinned: PostgreSQL on core 0, akerd on core 1, aker-loadgen / aker-changes on core 1.
# fsync = on, synchronous_commit = on. Loopback only; every run is bounded.
#   bash ops/changes-bench.sh          # results in target/changes-bench/, summary.md
#   env: WARM_OPS (30000), PHASE_S (20: each lag phase), DOWN_DELETES (500), OUT
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
warm_ops=${WARM_OPS:-30000}
phase_s=${PHASE_S:-20}
down_deletes=${DOWN_DELETES:-500}
out=${OUT:-$root/target/changes-bench}
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

data=$out/pgdata
port=55460
aport=7760
url="postgresql://aker@127.0.0.1:$port/postgres"
pw="$data.password"
pgsql() { bash ops/pg.sh psql "$data" "$port" -qAt -c "$1"; }
. ops/akerd-lib.sh   # akerd_start CONFIG LOG [CPUS], akerd_stop
cleanup() {
  akerd_cleanup
  bash ops/pg.sh stop "$data" 2>/dev/null || true
}
trap cleanup EXIT
PG_CPUS=0 PG_SETTINGS="-c shared_buffers=512MB -c max_connections=50 -c fsync=on \
  -c synchronous_commit=on -c wal_level=logical -c max_replication_slots=10 \
  -c max_slot_wal_keep_size=4GB -c jit=off" bash ops/pg.sh start "$data" "$port" $$ >/dev/null
pgsql "SELECT version()" > "$out/pg-version"
if [ ! -f "$out/load.json" ]; then
  taskset -c 1 ./target/release/aker-loadgen --pg "$url" --pg-password-file "$pw" \
    --pg-table items --pg-load "$base" --pg-index 16:64 --json "$out/load.json" > "$out/load.txt"
fi

config() { # NAME LOAD
  cat > "$out/$1.toml" <<TOML
[server]
listen = "127.0.0.1:$aport"
executors = 1
request_timeout_ms = 60000
[cache]
capacity_objects = 19950
snapshot_load = $2
[backend]
kind = "pgvector"
threads = 2
data_dir = "$1-data"
[backend.pgvector]
url = "$url"
password_file = "$pw"
table = "items"
changes = "follow"
[admin]
enabled = true
listen = "127.0.0.1:$((aport + 1))"
TOML
}
replay() { # TRACE JSON
  taskset -c 1 ./target/release/aker-loadgen -t 127.0.0.1:$aport -q -c 1 -d 1 --closed \
    --trace "$1" -w 0s -D 600s --json "$2" > /dev/null
}

# --- 1. warm restart ---------------------------------------------------------------------
for run in never warm cold; do
  load=true
  [ $run = cold ] && load=false
  rm -rf "$out/$run-data"
  config $run $load
  akerd_start "$out/$run.toml" "$out/$run-first.log" 1
  replay "$out/warm.trace" "$out/$run-warmup.json"
  if [ $run != never ]; then
    akerd_stop
    # While akerd is down: rows deleted by SQL (ids spread over the collection).
    pgsql "DELETE FROM items WHERE id IN (SELECT id FROM items ORDER BY id DESC LIMIT $down_deletes)"
    t0=$(date +%s.%N)
    akerd_start "$out/$run.toml" "$out/$run-restart.log" 1
    t1=$(date +%s.%N)
    echo "$run restart: $(python3 -c "print(f'{$t1 - $t0:.2f}')") s to ready (script's view)" \
      | tee "$out/$run-restart.txt"
  fi
  replay "$out/measure.trace" "$out/$run-measure.json"
  curl -s "http://127.0.0.1:$((aport + 1))/metrics" > "$out/$run.metrics" || true
  akerd_stop
  ./target/release/akerd --config "$out/$run.toml" --drop-slot >> "$out/$run-restart.log" 2>&1 || true
done

# --- 2. lag under SQL writes ---------------------------------------------------------------
config lag true
rm -rf "$out/lag-data"
akerd_start "$out/lag.toml" "$out/lag.log" 1
taskset -c 1 ./target/release/aker-changes --pg "$url" --pg-password-file "$pw" --table items \
  --akerd 127.0.0.1:$aport --seconds "$phase_s" --fractions 0,0.1,0.5,0.9 \
  --out "$out/lag.md" > "$out/lag.txt" 2>&1
curl -s "http://127.0.0.1:$((aport + 1))/metrics" > "$out/lag.metrics" || true
akerd_stop
./target/release/akerd --config "$out/lag.toml" --drop-slot >> "$out/lag.log" 2>&1 || true

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
print()
print(open(os.path.join(out, "lag.md")).read())
PY
grep -h "cache snapshot\|changes after the snapshot\|resumes\|following the table" \
  "$out"/warm-*.log "$out"/cold-*.log | cut -c1-300 || true
