#!/usr/bin/env bash
# bench/results/cluster.md: GloVe in PostgreSQL, the skew-0.99 trace, the same total
# pool (5% of the collection in objects) held by three akerd nodes of one cluster
# (centroid routing, with and without load-aware overrides; random routing) or by one
# akerd. Hit ratio, database searches per request and each node's share of requests,
# counted from the replies by examples/cluster_hits.rs. PostgreSQL on core 0, the
# akerds and the client on core 1 (this machine has two: no throughput scaling here).
#
#   bash ops/cluster-bench.sh [WARM (30000)] [REQUESTS (60000)]
#   env: SETS ("one centroid-rendezvous centroid-load random"; also centroid-fullpool, one-triple), PGBENCH_OUT
#        (target/pgbench), OUT (target/cluster-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
sets=" ${SETS:-one centroid-rendezvous centroid-load random} "
warm=${1:-30000}
requests=${2:-60000}
src=${PGBENCH_OUT:-$PWD/target/pgbench}
out=${OUT:-$PWD/target/cluster-bench}
mkdir -p "$out"
source ops/pgbench-lib.sh
pgbench_prepare
pool_objects=$((399000 * 5 / 100))
ef=$(cat "$src/ef-0.99")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  bash ops/pg.sh stop "$data" 2>/dev/null || true
}
trap cleanup EXIT
PG_CPUS=0 PG_SETTINGS="-c max_connections=60 -c wal_level=logical -c autovacuum=off \
  -c max_parallel_workers_per_gather=0 -c jit=off -c max_replication_slots=20" \
  bash ops/pg.sh start "$data" "$port" $$ > /dev/null
pgsql "CREATE EXTENSION IF NOT EXISTS pg_prewarm" > /dev/null
quiesce

# node NAME PORT POOL CLUSTER(empty: none) BALANCE: writes the config, starts akerd on core 1
node() {
  local name=$1 p=$2 pool=$3 cluster=$4 balance=$5 dir=$out/$1
  rm -rf "$dir"; mkdir -p "$dir"
  cat > "$dir/akerd.toml" <<TOML
[server]
listen = "127.0.0.1:$p"
executors = 1
request_timeout_ms = 60000
[cache]
k_max = 10
delta = 0
capacity_objects = $pool
[backend]
kind = "pgvector"
threads = 2
data_dir = "$dir/data"
[backend.pgvector]
url = "$url"
password_file = "$pw"
table = "items"
ef_search = $ef
[admin]
enabled = false
TOML
  if [ -n "$cluster" ]; then
    cat >> "$dir/akerd.toml" <<TOML
[cluster]
name = "$cluster"
advertise = "127.0.0.1:$p"
balance = "$balance"
balance_ms = 5000
TOML
  fi
  taskset -c 1 ./target/release/akerd --config "$dir/akerd.toml" > "$dir/akerd.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 600); do
    grep -q "akerd: ready" "$dir/akerd.log" && return 0
    sleep 0.1
  done
  tail "$dir/akerd.log" >&2; exit 1
}
stop_nodes() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  pids=()
  for d in "$out"/n*/akerd.toml "$out"/one/akerd.toml; do
    [ -f "$d" ] && ./target/release/akerd --config "$d" --drop-slot > /dev/null 2>&1 || true
  done
  pgsql "DROP SCHEMA IF EXISTS aker CASCADE" > /dev/null
}
hits() {  # NAME SEED ROUTING [--single]
  taskset -c 1 ./target/release/examples/cluster_hits --seed "$2" --routing "$3" \
    --trace "$src/glove-0.99.trace" --threads 4 --warm "$warm" --requests "$requests" ${4:-} \
    > "$out/$1.json"
  cat "$out/$1.json"
}
three() {  # NAME ROUTING BALANCE [POOL PER NODE (a third of the pool)]
  local third=${4:-$((pool_objects / 3))}
  local name=b_${1//-/_}
  node n1 7761 $third "$name" "$3"; node n2 7762 $third "$name" "$3"; node n3 7763 $third "$name" "$3"
  sleep 2
  hits "$1" 127.0.0.1:7761 "$2"
  ./target/release/aker-cli --target 127.0.0.1:7761 cluster > "$out/$1.cluster.txt"
  stop_nodes
  quiesce
}
git rev-parse --short HEAD > "$out/commit"
pgsql "DROP SCHEMA IF EXISTS aker CASCADE" > /dev/null
if [[ $sets == *" one "* ]]; then
  node one 7760 $pool_objects "" ""
  hits one 127.0.0.1:7760 single --single
  stop_nodes
  quiesce
fi
[[ $sets != *" centroid-rendezvous "* ]] || three centroid-rendezvous centroid rendezvous
[[ $sets != *" centroid-load "* ]] || three centroid-load centroid load
[[ $sets != *" random "* ]] || three random random rendezvous
# A diagnostic: each node with the whole pool (three times the memory). Near "one": the
# cluster's loss is its split pool; near centroid-*: the regions' borders.
[[ $sets != *" centroid-fullpool "* ]] || three centroid-fullpool centroid load "$pool_objects"
# ... against one node with three times the pool (the same memory in all).
if [[ $sets == *" one-triple "* ]]; then
  node one 7760 $((pool_objects * 3)) "" ""
  hits one-triple 127.0.0.1:7760 single --single
  stop_nodes
fi
echo "results in $out" >&2
