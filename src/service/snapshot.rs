//! What STATS and `/metrics` show: tables of metrics (name, help, how to read it), read
//! into one [`Snapshot`] that each format renders (`crate::metrics`).
//!
//! [`Shared::snapshot`] is the one place the samples are taken: the engine's counters,
//! the owners' gauges, the service's histograms and, last, the connection layer's
//! counters (handed to the service at start). STATS renders it as `name value` lines
//! ([`Shared::stats_text`]), `GET /metrics` as Prometheus text ([`Shared::prometheus`]).

use std::sync::atomic::{AtomicU64, Ordering};

use shards::counter::Counter;
use shards::floor::FloorState;
use shards::read::Counters;

use super::owner::ShardGauges;
use super::pgvector::changes::{ChangeStats, FeedState};
use super::pgvector::replica::ReplicaStats;
use super::pgvector::PgStats;
use super::recall::RecallChecks;
use super::Shared;
use crate::metrics::{
    self, Op, Recorded, Sample, ServiceCounters, Snapshot, Value, KIND_NAMES,
    RECALL_STATE_UNAVAILABLE,
};

/// Name, help, and how to read the value from a `T`.
type Row<T> = (&'static str, &'static str, fn(&T) -> Value);

/// The same for every shard, labelled `shard`.
type ShardRow = (&'static str, &'static str, fn(&Shared, usize) -> Value);

/// An engine counter, summed over shards.
type EngineRow = (&'static str, &'static str, fn(&Counters) -> &Counter);

const DAEMON: [Row<Shared>; 3] = [
    ("executors", "Executors (cores) serving.", |s| {
        Value::Gauge(s.info.executors as f64)
    }),
    ("shards", "Cache shards.", |s| {
        Value::Gauge(s.shards.len() as f64)
    }),
    ("uptime_seconds", "Seconds since start.", |s| {
        Value::Gauge(s.started.elapsed().as_secs_f64().floor())
    }),
];

const ENGINE: [EngineRow; 20] = [
    (
        "lookups",
        "Cache lookups (SEARCH without BYPASS_CACHE / REFRESH_ENTRY).",
        |c| &c.lookups,
    ),
    ("hits_exact", "Equality hits on a representative.", |c| {
        &c.exact_hits
    }),
    ("hits_alias", "Hits through an alias.", |c| &c.alias_hits),
    (
        "hits_approximate",
        "Approximate hits (a near representative within its threshold).",
        |c| &c.approximate_hits,
    ),
    (
        "misses",
        "Lookups answered by the backend (or, cache-aside, by the client).",
        |c| &c.misses,
    ),
    (
        "verifications",
        "Hits turned into verifying misses (Potluck+).",
        |c| &c.verifications,
    ),
    ("admissions", "Representatives admitted.", |c| &c.admissions),
    (
        "admissions_refused",
        "Admissions refused (too few results left, stale, too large).",
        |c| &c.admissions_refused,
    ),
    (
        "evictions",
        "Evictions (FIFO, or second chance: cache.eviction).",
        |c| &c.evictions,
    ),
    (
        "invalidations",
        "Entries invalidated (deletes, replacement, FLUSH).",
        |c| &c.invalidations,
    ),
    (
        "log_cap_invalidations",
        "Entries invalidated by the insert log's length cap.",
        |c| &c.log_cap_invalidations,
    ),
    (
        "delete_repairs",
        "Entries that promoted a reserve result after a delete.",
        |c| &c.delete_repairs,
    ),
    (
        "fast_path_updates",
        "Inserts merged by the fast path.",
        |c| &c.fast_path_updates,
    ),
    ("slow_path_steps", "Slow-path refresh steps.", |c| {
        &c.slow_path_steps
    }),
    (
        "slow_path_merges",
        "Inserts merged by the slow path.",
        |c| &c.slow_path_merges,
    ),
    (
        "catch_ups",
        "Entries caught up with the insert log at a hit's request.",
        |c| &c.catch_ups,
    ),
    (
        "hits_with_recent",
        "Hits that added inserts their entry had not accounted for yet.",
        |c| &c.hits_with_recent,
    ),
    (
        "hits_behind",
        "Lookups whose entry was further behind the insert log than a hit checks (answered as misses).",
        |c| &c.hits_behind,
    ),
    (
        "aliases_linked",
        "Aliases linked after approximate hits.",
        |c| &c.aliases_linked,
    ),
    (
        "alias_promotions",
        "Alias hits turned into misses that admit the query itself (the guarded policy).",
        |c| &c.alias_promotions,
    ),
];

/// The owners' gauges summed over shards, the queues and the router.
const OWNERS: [Row<Shared>; 10] = [
    ("pool_objects", "Neighbour objects held, all shards.", |s| {
        total(s, |g| &g.objects)
    }),
    (
        "pool_bytes",
        "Bytes held (objects, representatives, aliases), all shards.",
        |s| total(s, |g| &g.bytes),
    ),
    (
        "pool_capacity",
        "The global pool budget (bytes or objects, per the config).",
        |s| Value::Gauge(s.budget.total() as f64),
    ),
    (
        "representatives",
        "Representative entries, all shards.",
        |s| total(s, |g| &g.representatives),
    ),
    ("aliases", "Alias entries, all shards.", |s| {
        total(s, |g| &g.aliases)
    }),
    (
        "hints_dropped",
        "Owner hints (alias links, slow-path credit, admissions) dropped on a full queue.",
        |s| Value::Counter(s.shards.iter().map(|h| h.dropped()).sum()),
    ),
    ("backend_queue_len", "Backend requests queued.", |s| {
        Value::Gauge(s.backend.queue_len() as f64)
    }),
    (
        "router_rebalances",
        "Load-based centroid reassignments.",
        |s| Value::Counter(s.router.rebalances()),
    ),
    (
        "router_centroids_moved",
        "Centroids moved to another shard by rebalancing.",
        |s| count(&s.centroid_moves),
    ),
    (
        "router_previous_shards",
        "Moved centroids whose old shard lookups still probe (until its entries age out).",
        |s| Value::Gauge(s.router.previous_count() as f64),
    ),
];

/// Service counters besides requests and errors by operation.
const SERVICE: [Row<ServiceCounters>; 9] = [
    ("searches_bypass", "SEARCH with BYPASS_CACHE.", |c| {
        Value::Counter(c.searches_bypass)
    }),
    ("searches_refresh", "SEARCH with REFRESH_ENTRY.", |c| {
        Value::Counter(c.searches_refresh)
    }),
    (
        "searches_at_position",
        "SEARCH (and SEARCH_BATCH queries) with AT_POSITION (protocol version 5).",
        |c| Value::Counter(c.searches_at_position),
    ),
    (
        "searches_position_waited",
        "SEARCH AT_POSITION that waited for the change stream to reach its position.",
        |c| Value::Counter(c.searches_position_waited),
    ),
    (
        "searches_position_database",
        "SEARCH AT_POSITION answered by the database: the change stream behind its position, or none.",
        |c| Value::Counter(c.searches_position_database),
    ),
    (
        "backend_busy",
        "Requests refused with BUSY: backend queue full.",
        |c| Value::Counter(c.backend_busy),
    ),
    ("backend_errors", "Backend calls that failed.", |c| {
        Value::Counter(c.backend_errors)
    }),
    ("fills_admitted", "FILLs the cache admitted.", |c| {
        Value::Counter(c.fills_admitted)
    }),
    (
        "backend_short_answers",
        "Misses the backend answered with fewer rows than asked (served, not admitted).",
        |c| Value::Counter(c.backend_short_answers),
    ),
];

/// The pgvector backend's connection pool.
const PG: [Row<PgStats>; 7] = [
    (
        "pg_connections_up",
        "pgvector: backend threads holding a live database connection.",
        |p| Value::Gauge(p.connections_up.load(Ordering::Relaxed) as f64),
    ),
    (
        "pg_reconnects",
        "pgvector: connections reopened after one was lost.",
        |p| count(&p.reconnects),
    ),
    (
        "pg_connect_failures",
        "pgvector: connection attempts that failed.",
        |p| count(&p.connect_failures),
    ),
    (
        "pg_statement_timeouts",
        "pgvector: statements cancelled at their request's deadline.",
        |p| count(&p.statement_timeouts),
    ),
    (
        "pg_rows_skipped",
        "pgvector: rows left out of answers (a negative id, or no finite distance).",
        |p| count(&p.rows_skipped),
    ),
    (
        "pg_writes_in_doubt",
        "pgvector: writes whose commit was in doubt (connection lost, no answer); \
         their ids were dropped from the cache and their sessions ended.",
        |p| count(&p.writes_in_doubt),
    ),
    (
        "pg_writes_unsettled",
        "pgvector: writes in doubt whose server session could not be confirmed gone.",
        |p| count(&p.writes_unsettled),
    ),
];

/// The pgvector table's change stream (`pgvector/changes/`).
const CHANGES: [Row<ChangeStats>; 16] = [
    (
        "pg_changes_up",
        "pgvector: 1 while akerd follows the table's committed changes and is connected.",
        |c| Value::Gauge(f64::from(c.state.load(Ordering::Relaxed) == FeedState::Following as u64)),
    ),
    (
        "pg_changes_state",
        "pgvector: the change stream: 0 off, 1 following, 2 reconnecting, 3 stopped (the table changed).",
        |c| gauge(&c.state),
    ),
    ("pg_changes_inserts", "pgvector: inserted rows applied from the change stream.", |c| count(&c.inserts)),
    ("pg_changes_updates", "pgvector: updated rows applied from the change stream.", |c| count(&c.updates)),
    ("pg_changes_deletes", "pgvector: deleted rows applied from the change stream.", |c| count(&c.deletes)),
    ("pg_changes_truncates", "pgvector: TRUNCATEs applied (each flushes the cache).", |c| count(&c.truncates)),
    ("pg_changes_commits", "pgvector: transactions applied from the change stream.", |c| count(&c.commits)),
    (
        "pg_changes_lag_bytes",
        "pgvector: WAL between the server's flush position and the applied one, at the last read.",
        |c| gauge(&c.lag_bytes),
    ),
    (
        "pg_changes_lag_ms",
        "pgvector: commit to applied, of the last transaction applied (0 once a read finds nothing).",
        |c| gauge(&c.lag_ms),
    ),
    (
        "pg_changes_retained_bytes",
        "pgvector: WAL the slot holds back on the database server.",
        |c| gauge(&c.retained_bytes),
    ),
    (
        "pg_changes_slot_lost",
        "pgvector: slots found gone or invalidated (the cache flushed, the slot made anew).",
        |c| count(&c.slot_lost),
    ),
    (
        "pg_changes_updates_partial",
        "pgvector: updates of an id whose vector came unchanged (TOAST): the old id stripped only.",
        |c| count(&c.updates_partial),
    ),
    ("pg_changes_polls", "pgvector: reads of the change stream.", |c| count(&c.polls)),
    (
        "pg_changes_stale_searches",
        "pgvector: searches sent to the database because the stream was behind max_staleness_ms.",
        |c| count(&c.stale_searches),
    ),
    (
        "pg_changes_applied_lsn",
        "pgvector: the WAL position (pg_lsn as a number) every shard has applied the stream to.",
        |c| gauge(&c.applied_lsn),
    ),
    (
        "pg_changes_reconnects",
        "pgvector: change stream connections reopened after the database went away.",
        |c| count(&c.reconnects),
    ),
];

/// The pgvector backend's read replicas (`pgvector/replica.rs`).
const REPLICAS: [Row<ReplicaStats>; 6] = [
    (
        "pg_replica_searches",
        "pgvector: misses a read replica answered.",
        |r| count(&r.searches),
    ),
    (
        "pg_replica_behind",
        "pgvector: replica answers discarded (the replica had not replayed what the cache \
         holds, or was not in recovery) and run on the primary.",
        |r| count(&r.behind),
    ),
    (
        "pg_replica_conflicts",
        "pgvector: replica searches cancelled by a recovery conflict, run on the primary.",
        |r| count(&r.conflicts),
    ),
    (
        "pg_replica_failed",
        "pgvector: replica searches that timed out, were cancelled, failed or lost their \
         connection, run on the primary (the replica passed over for a second).",
        |r| count(&r.failed),
    ),
    (
        "pg_replica_lag_bytes",
        "pgvector: the change stream's applied position minus a replica's replayed one, \
         at the last replica search (0 when the replica was ahead).",
        |r| gauge(&r.lag_bytes),
    ),
    (
        "pg_replica_up",
        "pgvector: read replica connections up, over every backend thread.",
        |r| gauge(&r.up),
    ),
];

const PER_SHARD: [ShardRow; 15] = [
    (
        "shard_pool_objects",
        "Neighbour objects per shard.",
        |s, i| gauge(&s.gauges[i].objects),
    ),
    ("shard_pool_bytes", "Bytes held per shard.", |s, i| {
        gauge(&s.gauges[i].bytes)
    }),
    (
        "shard_representatives",
        "Representatives per shard.",
        |s, i| gauge(&s.gauges[i].representatives),
    ),
    ("shard_aliases", "Aliases per shard.", |s, i| {
        gauge(&s.gauges[i].aliases)
    }),
    (
        "shard_insert_log_len",
        "Insert log records held per shard.",
        |s, i| gauge(&s.gauges[i].insert_log_len),
    ),
    ("shard_risk", "Refresh risk R per shard.", |s, i| {
        Value::Gauge(s.gauges[i].risk())
    }),
    (
        "shard_filter_live",
        "Live filter points per shard.",
        |s, i| gauge(&s.gauges[i].filter_live),
    ),
    (
        "shard_filter_tombstones",
        "Filter tombstones per shard.",
        |s, i| gauge(&s.gauges[i].filter_tombstones),
    ),
    (
        "shard_filter_rotations",
        "Filter generation rotations per shard.",
        |s, i| gauge(&s.gauges[i].filter_rotations),
    ),
    (
        "shard_filter_standby_live",
        "Live entries of the standby filter generation per shard (above 0, \
         lookups search two generations).",
        |s, i| gauge(&s.gauges[i].filter_standby_live),
    ),
    (
        "shard_filter_standby_moved",
        "Standby filter entries moved into the active generation in idle time.",
        |s, i| gauge(&s.gauges[i].filter_standby_moved),
    ),
    ("shard_share", "Pool budget share per shard.", |s, i| {
        Value::Gauge(s.budget.share(i) as f64)
    }),
    (
        "shard_queue_len",
        "Owner queue length per shard.",
        |s, i| Value::Gauge(s.shards[i].queue_len() as f64),
    ),
    ("shard_hints_dropped", "Hints dropped per shard.", |s, i| {
        Value::Counter(s.shards[i].dropped())
    }),
    (
        "shard_messages",
        "Owner messages applied per shard.",
        |s, i| count(&s.gauges[i].messages),
    ),
];

const LATENCY_HELP: &str = "Service time per operation and SEARCH hit kind.";

const RECALL_STATE_HELP: &str = "Recall floor: 0 off, 1 warming (too few checks), 2 holding, \
     3 tightening, 4 unreachable (thresholds at their minimum), 5 unavailable (cache-aside).";

fn count(c: &AtomicU64) -> Value {
    Value::Counter(c.load(Ordering::Relaxed))
}

fn gauge(g: &AtomicU64) -> Value {
    Value::Gauge(ShardGauges::get(g) as f64)
}

fn total(s: &Shared, field: fn(&ShardGauges) -> &AtomicU64) -> Value {
    let sum: u64 = s.gauges.iter().map(|g| ShardGauges::get(field(g))).sum();
    Value::Gauge(sum as f64)
}

fn read<T>(s: &mut Snapshot, from: &T, rows: &[Row<T>]) {
    for &(name, help, value) in rows {
        s.push(Sample::new(name, help, value(from)));
    }
}

impl Shared {
    /// Every metric at one moment, in STATS order: the service's, then the connection
    /// layer's `server_*` counters.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::default();
        read(&mut s, self, &DAEMON);
        self.engine_counters(&mut s);
        read(&mut s, self, &OWNERS);
        self.recall_metrics(&mut s);
        self.durable_metrics(&mut s);
        self.cluster_metrics(&mut s);
        let recorded = metrics::merge_all(self.metrics.iter().map(|m| &**m));
        service_counters(&mut s, &recorded.counters);
        if let Some(pg) = self.backend.pgvector() {
            read(&mut s, &pg.stats, &PG);
            read(&mut s, &pg.changes.stats, &CHANGES);
            read(&mut s, &pg.replicas.stats, &REPLICAS);
        }
        self.per_shard(&mut s);
        latencies(&mut s, recorded);
        s.samples.extend(self.server_stats.samples());
        s
    }

    /// The STATS reply's text (the connection layer cuts it to the frame limit).
    pub(crate) fn stats_text(&self) -> String {
        self.snapshot().render_stats()
    }

    /// The body of `GET /metrics`: the same samples as STATS, as Prometheus text.
    pub(crate) fn prometheus(&self) -> String {
        self.snapshot().render_prometheus()
    }

    /// The embedded store's rows and, when durable (`backend.data_dir`), its log; all
    /// from atomics (this runs on executors: no lock of the store or the log).
    fn durable_metrics(&self, s: &mut Snapshot) {
        if let Some(rows) = self.backend.store_len() {
            s.gauge(
                "store_rows",
                "Live rows in the embedded store.",
                rows as f64,
            );
        }
        if let Some(d) = &self.durable {
            let (appends, syncs, durable) = d.wal.counts();
            s.counter(
                "store_log_appends",
                "Writes appended to the store's log.",
                appends,
            );
            s.counter(
                "store_log_syncs",
                "fdatasync calls on the log (a sync covers every append before it: group commit).",
                syncs,
            );
            s.gauge(
                "store_log_durable_seq",
                "The last log record known on stable storage.",
                durable as f64,
            );
            s.gauge(
                "store_log_segment_bytes",
                "Bytes in the log's current segment (a checkpoint at backend.checkpoint_log_bytes).",
                d.wal.segment_bytes() as f64,
            );
            s.counter(
                "store_checkpoints",
                "Checkpoints written since start.",
                d.checkpoints_written.load(Ordering::Relaxed),
            );
            s.gauge(
                "store_graph_loaded",
                "1: the HNSW graph was loaded from the checkpoint at start; 0: built from the rows \
                 (or an exact store).",
                f64::from(u8::from(d.graph_loaded.load(Ordering::Relaxed))),
            );
        }
        let Some(w) = &self.snapshots else { return };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        s.counter(
            "cache_snapshots",
            "Cache snapshots written since start (shutdown, timer, POST /snapshot).",
            get(&w.written),
        );
        s.counter(
            "cache_snapshot_failures",
            "Cache snapshots not written (the reason is logged).",
            get(&w.failed),
        );
        s.gauge(
            "cache_snapshot_seq",
            "The log seq of the last cache snapshot written since start (0: none).",
            get(&w.last_seq) as f64,
        );
        s.gauge(
            "cache_snapshot_seconds",
            "Seconds the last cache snapshot took.",
            f64::from_bits(get(&w.last_secs_bits)),
        );
        s.gauge(
            "cache_snapshot_restored_entries",
            "Entries restored from a snapshot at start (0: a cold start).",
            get(&w.restored) as f64,
        );
    }

    /// This node's side of a cluster (`crate::cluster`); nothing outside one.
    fn cluster_metrics(&self, s: &mut Snapshot) {
        let Some(c) = &self.cluster else { return };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let view = c.view();
        s.gauge("cluster_routing_version", "The routing state's stamp SEARCH replies carry (changes with centroids, overrides, live nodes).", view.routing_version as f64);
        s.gauge(
            "cluster_centroids_version",
            "The cluster's centroids version (a retrain bumps it).",
            view.centroids_version as f64,
        );
        s.gauge(
            "cluster_balance_epoch",
            "The load-aware overrides' version (0: none published).",
            view.balance_epoch as f64,
        );
        s.gauge(
            "cluster_live_nodes",
            "Nodes whose lease holds, this one included when renewing.",
            get(&c.live_nodes) as f64,
        );
        s.gauge(
            "cluster_owned_centroids",
            "Centroids this node owns (override or rendezvous).",
            c.owned_centroids() as f64,
        );
        s.gauge(
            "cluster_owned_load_per_s",
            "Searches per second this node counted on the centroids it owns (smoothed).",
            get(&c.owned_load_per_s) as f64,
        );
        s.counter("cluster_foreign_searches", "Searches whose nearest centroid another node owns (a client with an old routing state, or none).", c.foreign_searches.get());
        s.counter(
            "cluster_lease_renewals",
            "Lease renewals that succeeded.",
            get(&c.renewals),
        );
        s.counter(
            "cluster_lease_failures",
            "Lease renewals that failed or timed out (the lease lapses after lease_ms).",
            get(&c.renew_failures),
        );
        s.counter(
            "cluster_balance_publications",
            "Load-aware assignments this node published (as the balancing node).",
            get(&c.balance_publications),
        );
        s.counter(
            "cluster_slots_dropped",
            "Replication slots of long-gone nodes this node dropped.",
            get(&c.slots_dropped),
        );
    }

    /// The recall floor's estimate and checks (`recall.rs`); its state alone when off.
    fn recall_metrics(&self, s: &mut Snapshot) {
        let g = |name, help, v: f64| Sample::new(name, help, Value::Gauge(v));
        let floor = self.recall.as_ref().map(|r| (r, r.estimate(&self.shards)));
        let state = match &floor {
            _ if self.recall_unavailable => RECALL_STATE_UNAVAILABLE,
            None => FloorState::Off.code(),
            Some((_, e)) => e.state.code(),
        };
        s.push(g("recall_floor_state", RECALL_STATE_HELP, f64::from(state)));
        let Some((checks, e)) = floor else { return };
        s.push(g(
            "recall_floor",
            "The declared recall floor (cache.recall_floor).",
            e.floor,
        ));
        s.push(g(
            "recall_estimate",
            "Estimated recall@k of all replies relative to the backend's answers (a miss \
             counts 1), from the checks.",
            e.recall,
        ));
        s.push(g(
            "recall_estimate_low",
            "Lower end of the estimate's one-sided 95% bound (held at or above the floor).",
            e.low,
        ));
        s.push(g(
            "recall_estimate_high",
            "Upper end of the same bound.",
            e.high,
        ));
        s.push(g(
            "recall_threshold_scale",
            "Factor on every approximate-hit threshold (1: the policy's own).",
            f64::from(e.scale),
        ));
        for (kind, k) in ["exact", "alias", "approximate"].into_iter().zip(e.kinds) {
            let per = |name, help, v| g(name, help, v).label("kind", kind);
            s.push(per(
                "recall_kind_estimate",
                "Mean recall of a hit kind's checks (1 before 10).",
                k.recall,
            ));
            s.push(per(
                "recall_kind_estimate_low",
                "Its one-sided 95% lower bound (0 before 10 checks).",
                k.low,
            ));
            s.push(per(
                "recall_kind_share",
                "The kind's share of replies (decayed).",
                k.share,
            ));
            s.push(
                Sample::counter("recall_kind_checks", "Checks of a hit kind.", k.samples)
                    .label("kind", kind),
            );
        }
        s.counter(
            "recall_floor_tightened",
            "Controller steps that tightened the thresholds.",
            e.tightened,
        );
        s.counter(
            "recall_floor_relaxed",
            "Controller steps that relaxed them.",
            e.relaxed,
        );
        recall_checks(s, checks);
    }

    fn engine_counters(&self, s: &mut Snapshot) {
        for (name, help, field) in ENGINE {
            let sum = self
                .shards
                .iter()
                .map(|h| field(h.reader.counters()).get())
                .sum();
            s.counter(name, help, sum);
        }
    }

    /// One family at a time, every shard.
    fn per_shard(&self, s: &mut Snapshot) {
        for (name, help, value) in PER_SHARD {
            for i in 0..self.shards.len() {
                s.push(Sample::new(name, help, value(self, i)).label("shard", i.to_string()));
            }
        }
    }
}

fn service_counters(s: &mut Snapshot, c: &ServiceCounters) {
    let by_op = [
        (
            "requests",
            "Requests the service handled, by operation.",
            &c.requests,
        ),
        (
            "errors",
            "Requests answered with an error, by operation.",
            &c.errors,
        ),
    ];
    for (name, help, counts) in by_op {
        for op in Op::ALL {
            s.push(Sample::counter(name, help, counts[op as usize]).label("op", op.name()));
        }
    }
    read(s, c, &SERVICE);
}

/// Per operation, SEARCH per hit kind, and the backend calls.
fn latencies(s: &mut Snapshot, recorded: Recorded) {
    let latency = |h| Sample::new("latency", LATENCY_HELP, Value::Latency(h));
    let Recorded {
        ops,
        kinds,
        backend,
        ..
    } = recorded;
    for (op, h) in Op::ALL.into_iter().zip(ops) {
        s.push(latency(h).label("op", op.name()));
    }
    for (kind, h) in KIND_NAMES.into_iter().zip(kinds) {
        s.push(latency(h).label("op", "search").label("kind", kind));
    }
    s.push(latency(backend).label("op", "backend_search"));
}

/// What the recall floor's checks cost and found.
fn recall_checks(s: &mut Snapshot, checks: &RecallChecks) {
    let c = &checks.counters;
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    s.counter(
        "recall_checks_queued",
        "Hits queued for a check against the backend.",
        n(&c.queued),
    );
    s.counter(
        "recall_checks_done",
        "Checks answered by the backend and counted.",
        n(&c.done),
    );
    for (reason, v) in [
        ("busy", n(&c.dropped_busy)),
        ("rate", n(&c.dropped_rate)),
        ("full", n(&c.dropped_full)),
        ("stale", n(&c.dropped_stale)),
    ] {
        s.push(
            Sample::counter(
                "recall_checks_dropped",
                "Sampled hits not checked: backend busy, over recall_checks_per_s, \
                 checks queue full, or waited over 1 s for an idle backend thread.",
                v,
            )
            .label("reason", reason),
        );
    }
    s.counter(
        "recall_check_failures",
        "Checks whose backend search failed.",
        n(&c.failed),
    );
    s.counter(
        "recall_repairs",
        "Exact or alias entries refreshed because a check differed.",
        n(&c.repairs),
    );
    s.counter(
        "recall_deleted_ids",
        "Served ids a check found missing from the store (stripped from every shard).",
        n(&c.deleted_ids),
    );
}
