#!/usr/bin/env bash
# A miss through akerd against PostgreSQL alone (issue #42, target 1): closed-loop runs of
# the GloVe trace's searches, alternated round by round,
#   pg         straight into PostgreSQL (aker-loadgen --pg) at CONNS connections
#   <variant>  through akerd with BYPASS_CACHE (every search a miss), backend.threads =
#              CONNS unless the variant says otherwise, 8 client connections x 8 deep
# and, for each run, where the time goes:
#   - PostgreSQL's side: pg_stat_activity of the searching sessions sampled every 100 ms
#     (active, or idle waiting for the client: `ClientRead`), so a session that waits on
#     its client shows akerd (or the load generator) slow to send the next statement;
#   - akerd's side: each backend thread's run-queue delay (/proc schedstat, the second
#     field) over the counted part, per search: the time a thread with an answer ready
#     waited for the core; and akerd's CPU time (user + system, /proc/PID/stat) over the
#     counted part, per search: what a miss (or, with the cache on, the mix of hits and
#     misses) costs akerd's cores, the c_miss of bench/results/cluster.md's model; its
#     CPU with no load over IDLE_S (5) seconds before the run is taken off first.
# PostgreSQL on core 0, akerd and aker-loadgen on core 1 (ops/pgvector-bench.sh's
# pinning); autovacuum off and every round started from the same state (`quiesce`). The data, traces and ef_search come from that script (run with SETS=none).
#
#   bash ops/miss-parity.sh [ROUNDS (3)] [DURATION_S (15)] [WARMUP_S (5)]
#   env: SKEW (0.99), CONNS (4), VARIANTS ("nice10 nice0"), PGBENCH_OUT (target/pgbench),
#        OUT (target/miss-parity)
# Variants: default (akerd's own backend.nice), nice10 / nice0 (backend.nice 10 / 0),
# nice0-t8 (nice 0, 8 backend threads); cache-nice0 / cache-nice10: the cache on (5% of
# the collection in objects, akerd's default policy, flushed first) instead of bypassed,
# for what the backend threads' nice does to hits; pg-cN: PostgreSQL alone at N connections (pg-c8:
# 8); pg-cg: PostgreSQL alone again with the server's processes moved into a memory group
# without a limit (as ops/pgvector-bench.sh's unconstrained set runs it; every other run
# moves them back to the root group).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
dur=${2:-15}
warm=${3:-5}
skew=${SKEW:-0.99}
conns=${CONNS:-4}
variants=${VARIANTS:-nice10 nice0}
src=${PGBENCH_OUT:-$PWD/target/pgbench}
out=${OUT:-$PWD/target/miss-parity}
mkdir -p "$out"
source ops/pgbench-lib.sh
pgbench_prepare
source ops/akerd-lib.sh
aport=7730
ef=$(cat "$src/ef-$skew")
trace=$src/glove-$skew.trace
lg() { taskset -c 1 ./target/release/aker-loadgen "$@"; }
v1=/sys/fs/cgroup/memory
cg=$v1/aker-miss-parity
moved=
[[ " $variants " != *" pg-cg "* ]] || [ -w "$v1" ] || { echo "pg-cg needs the cgroup v1 memory controller at $v1" >&2; exit 2; }
PG_CPUS=0 PG_SETTINGS="-c shared_buffers=512MB -c max_connections=50 -c fsync=on \
  -c synchronous_commit=on -c max_parallel_workers_per_gather=0 -c jit=off -c autovacuum=off" \
  bash ops/pg.sh start "$data" "$port" $$ > /dev/null
trap 'akerd_cleanup; bash ops/pg.sh stop "$data" 2>/dev/null || true; rmdir "$cg" 2>/dev/null || true' EXIT
pgsql "CREATE EXTENSION IF NOT EXISTS pg_prewarm" > /dev/null
pgsql "SELECT sum(pg_prewarm(c.oid)) FROM pg_class c WHERE c.oid = 'items'::regclass
       OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'items'::regclass)" > /dev/null

# The searching sessions' states every 100 ms over the counted part, from one psql
# session (\watch): one line each, "active" or the wait event of an idle session.
sample_sessions() {
  printf '%s\n' "SELECT CASE WHEN state = 'active' THEN 'active' ELSE coalesce(wait_event, state) END
    FROM pg_stat_activity WHERE usename = 'aker' AND backend_type = 'client backend'
    AND pid <> pg_backend_pid()" "\\watch interval=0.1 count=$((dur * 10))" |
    bash ops/pg.sh psql "$data" "$port" -qAt 2>/dev/null | grep -v '^$' || true
}
# Busy jiffies and all jiffies of core 0 (PostgreSQL's), from /proc/stat; steal counts
# in the total, not as busy.
cpu0() { awk '$1 == "cpu0" {print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
# akerd's CPU time so far (user + system, clock ticks), from /proc/PID/stat (the fields
# after the command name, which may hold spaces).
cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
clk_tck=$(getconf CLK_TCK)
idle_s=${IDLE_S:-5}
# Sum of the run-queue delay (ns) of akerd's backend threads.
runq_ns() {
  local s=0 t ns
  for t in /proc/"$1"/task/*; do
    grep -q '^aker-backend' "$t/comm" 2>/dev/null || continue
    ns=$(awk '{print $2}' "$t/schedstat" 2>/dev/null) || continue
    s=$((s + ${ns:-0}))
  done
  echo $s
}
# Moves the server's processes (the postmaster and its children) into memory group $1
# (cgroup v1, as ops/pgvector-bench.sh uses it).
pg_into() {
  local pid
  [ -d "$1" ] || mkdir "$1"
  for pid in $(pgrep -u aker-pg postgres); do echo "$pid" > "$1/cgroup.procs" 2>/dev/null || true; done
}
akerd_config() {  # VARIANT FILE
  local threads=$conns nice=10 cache=
  case $1 in
    default) nice= ;;
    cache-nice0) nice=0; cache="capacity_objects = 19950" ;;
    cache-nice10) cache="capacity_objects = 19950" ;;
    nice10) ;;
    nice0) nice=0 ;;
    nice0-t8) nice=0; threads=8 ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
  cat > "$2" <<TOML
[server]
listen = "127.0.0.1:$aport"
executors = 1
inflight_max = 128
request_timeout_ms = 60000
[cache]
k_max = 10
delta = 0
$cache
[backend]
kind = "pgvector"
threads = $threads
${nice:+nice = $nice}
[backend.pgvector]
url = "$url"
password_file = "$pw"
table = "items"
ef_search = $ef
TOML
}
run() {  # NAME ROUND
  local name=$1 r=$2 runq0=0 runq1=0 cpuak0=0 cpuak1=0
  if [ "$name" = pg-cg ]; then pg_into "$cg"; moved=1
  elif [ -n "$moved" ]; then pg_into "$v1"; moved=
  fi
  local idle0=0 idle1=0
  if [[ $name != pg* ]]; then
    akerd_config "$name" "$out/$name.toml"
    akerd_start "$out/$name.toml" "$out/$name-r$r.log" 1
    # akerd's CPU with no load (its executors, the change stream's polls, timers), over
    # IDLE_S seconds: taken off the loaded figure, so that what is left is per search.
    sleep 1
    idle0=$(cpu_ticks "$akerd")
    sleep "$idle_s"
    idle1=$(cpu_ticks "$akerd")
  fi
  (sleep "$warm"; sample_sessions > "$out/$name-r$r.sessions") &
  (sleep "$warm"; cpu0 > "$out/.cpu0"; [ -z "$akerd" ] || { runq_ns "$akerd" > "$out/.runq0"; cpu_ticks "$akerd" > "$out/.cpuak0"; }) &
  if [[ $name == pg* ]]; then
    local c=$conns
    [[ ! $name =~ ^pg-c([0-9]+)$ ]] || c=${BASH_REMATCH[1]}
    lg --pg "$url" --pg-password-file "$pw" --pg-table items --pg-ef "$ef" --trace "$trace" \
       --closed --loop -c "$c" -w "${warm}s" -D "${dur}s" --json "$out/$name-r$r.json" > /dev/null
    read -r b1 a1 < <(cpu0)
  else
    local how=--bypass
    [[ $name != cache-* ]] || how=--flush
    lg -t 127.0.0.1:$aport -c 8 -d 8 -w "${warm}s" -D "${dur}s" -q --closed --trace "$trace" \
       --loop "$how" --json "$out/$name-r$r.json" > /dev/null
    read -r b1 a1 < <(cpu0)
    runq1=$(runq_ns "$akerd")
    cpuak1=$(cpu_ticks "$akerd")
    runq0=$(cat "$out/.runq0")
    cpuak0=$(cat "$out/.cpuak0")
    akerd_stop
  fi
  wait
  read -r b0 a0 < "$out/.cpu0"
  echo "{\"runq_ns\": $((runq1 - runq0)), \"akerd_cpu_s\": $(python3 -c "print(($cpuak1 - $cpuak0) / $clk_tck)"), \"akerd_idle_cpu_per_s\": $(python3 -c "print(($idle1 - $idle0) / $clk_tck / $idle_s)"), \"counted_s\": $dur, \"cpu0_busy\": $(python3 -c "print(round(($b1 - $b0) / max(1, $a1 - $a0), 4))")}" \
    > "$out/$name-r$r.extra.json"
  echo "$(date -u +%FT%TZ) $name round $r done" >&2
}
for r in $(seq "$rounds"); do
  quiesce
  run pg "$r"
  for v in $variants; do run "$v" "$r"; done
done
python3 ops/miss_parity_summary.py "$out" | tee "$out/summary.md"
