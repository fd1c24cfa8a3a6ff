# Sourced by the scripts that measure akerd against GloVe in PostgreSQL
# (ops/headline.sh, ops/miss-parity.sh), from the repository root, after setting `src`
# (ops/pgvector-bench.sh's output folder) and `out`:
#   pgbench_prepare   the data, traces and ef_search (ops/pgvector-bench.sh with
#                     SETS=none), then data / port / url / pw for its database
#   pgsql SQL         one statement through psql
#   quiesce           the same database state before every round, for both sides:
#                     VACUUM ANALYZE, CHECKPOINT, table and index read into shared
#                     buffers (autovacuum is off in these scripts, so nothing starts
#                     mid-run); needs pg_prewarm (CREATE EXTENSION once started)
pgbench_prepare() {
  SETS=none PGBENCH_OUT=$src bash ops/pgvector-bench.sh > "$out/prepare.log"
  # That script's server watcher stops the data directory's server within a second of
  # its exit: let it act before the caller starts its own.
  sleep 2
  data=$src/pgdata
  port=${PGPORT_BENCH:-55440}
  url="postgresql://aker@127.0.0.1:$port/postgres"
  pw="$data.password"
}
pgsql() { bash ops/pg.sh psql "$data" "$port" -qAt -c "$1"; }
quiesce() {
  pgsql "VACUUM (ANALYZE) items" > /dev/null
  pgsql "CHECKPOINT" > /dev/null
  pgsql "SELECT sum(pg_prewarm(c.oid)) FROM pg_class c WHERE c.oid = 'items'::regclass
         OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'items'::regclass)" > /dev/null
}
