//! The daemon's one TOML file (`ops/akerd.toml` is the commented example). Every table
//! and key is optional (defaults below); an unknown key is an error, so a typo does not
//! silently fall back to a default.
//!
//! ```toml
//! [server]    # connection layer: listen, executors, cpus, limits (aker::server::ServerConfig)
//! [cache]     # the engine: metric, k_max, delta, capacity, filter, policy, log caps
//! [sharding]  # shards (0 = 2 x executors), centroids, rebalance period
//! [backend]   # embedded (in-process HNSW / exact store over a collection), pgvector
//!             # (a PostgreSQL table: [backend.pgvector]) or cache_aside
//! [admin]     # Prometheus text endpoint (GET /metrics), 127.0.0.1 by default
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shards::floor::FloorConfig;
use shards::{CacheConfig, Capacity, Eviction, FilterKind, Metric, PolicyConfig, StandbySearch};

mod server;
pub use server::{ServerConfig, FRAME_BYTES_MIN};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub cache: CacheSection,
    pub sharding: ShardingSection,
    pub backend: BackendSection,
    pub admin: AdminSection,
    pub auth: AuthSection,
}

/// Where the shared secret of protocol version 3's AUTH comes from (`crate::auth`). Only
/// where: the secret itself is never part of the configuration, so `--print-config`
/// and the logs cannot show it. Neither set: no authentication.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSection {
    /// A file whose first line is the secret (relative to the config file's folder).
    pub secret_file: Option<PathBuf>,
    /// An environment variable holding the secret.
    pub secret_env: Option<String>,
}

impl AuthSection {
    pub fn enabled(&self) -> bool {
        self.secret_file.is_some() || self.secret_env.is_some()
    }
}

/// The engine's knobs (`shards::CacheConfig`); the dimension comes from the data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheSection {
    /// `l2sq` (squared L2), `cosine` (1 - cos) or `ip` (-dot); the engine's other
    /// spellings (`l2`, `dot`, `inner_product`, ...) are accepted too. Unset: `l2sq` for
    /// the embedded and cache-aside backends; for pgvector, the operator class of the
    /// column's HNSW index (set it when the column has indexes for several metrics).
    pub metric: Option<Metric>,
    pub k_max: usize,
    /// Reserve results kept beyond k (Δ): deletes promote them instead of invalidating.
    pub delta: usize,
    /// Pool budget in bytes (objects, representatives, aliases), over all shards.
    /// Exactly one of `capacity_bytes` / `capacity_objects`; bytes is the default.
    pub capacity_bytes: Option<usize>,
    /// Pool budget in distinct neighbour objects (the paper's unit), over all shards.
    pub capacity_objects: Option<usize>,
    pub store_vectors: bool,
    /// `{ kind = "hnsw", m = 4, ef_construction = 8, ef_search = 16 }` or
    /// `{ kind = "brute_force" }`.
    pub filter: FilterKind,
    pub filter_candidates: usize,
    /// `learned` (the default here): while a rotation leaves two filter generations,
    /// the one lookups' approximate hits have been coming from is searched first and
    /// answers when it has a candidate that serves, the other is searched only
    /// otherwise; `active_first`: the same with the newer generation always first;
    /// `nearest` is ALGORITHM.md's rule (and the engine's default): the nearest serving
    /// candidate of either generation.
    pub standby_search: StandbySearch,
    /// An insert reaches every cached entry it belongs in before it is acknowledged
    /// (an exact index on every shard), not only the nearest one the filter finds
    /// (`shards::CacheConfig::complete_fast_path`; costs in `bench/results/engine.md`).
    pub complete_fast_path: bool,
    /// `fifo` (the paper's) or `second_chance` (CLOCK: an entry hit since the hand last
    /// passed it stays).
    pub eviction: Eviction,
    pub max_aliases_per_rep: usize,
    pub slow_path_batch: usize,
    pub slow_path_max_steps: usize,
    pub risk_threshold: f64,
    pub insert_log_cap: usize,
    /// Most bytes of the insert log (vectors and bookkeeping); with `insert_log_cap`,
    /// whichever binds first.
    pub insert_log_bytes: usize,
    pub delete_log_cap: usize,
    /// `{ kind = "aker", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }`,
    /// `{ kind = "guarded", alpha_l, alpha_t, tau_init_divisor, spread = 0.0 }` (Aker's
    /// rules, an alias asked again promoted: docs/ALGORITHM.md),
    /// `{ kind = "proximity", threshold = .. }` or `{ kind = "potluck", .. }`; a threshold
    /// is a gap (`shards::gap`): the metric's distance, on `ip` the angle `1 - cos`.
    pub policy: PolicyConfig,
    /// The recall@k that what akerd serves must keep, relative to the backend's own
    /// answer for the same request (over all replies; a miss counts 1): sampled hits
    /// are checked against the backend in its spare capacity, and hit thresholds are
    /// tightened while the estimate's lower bound is below it (docs/ALGORITHM.md, "The
    /// recall floor"). 0 turns it off; unavailable in cache-aside mode.
    pub recall_floor: f64,
    /// Fraction of approximate and alias hits checked (exact hits: an eighth of it).
    pub recall_sample: f64,
    /// Most checks a second over all executors; past it, sampled hits go unchecked.
    pub recall_checks_per_s: u32,
    /// The loosest threshold scale the floor may set: 1 keeps the policy's own
    /// thresholds as the loosest; above 1 it may loosen past them while the floor holds.
    pub recall_scale_max: f32,
    /// Messages queued to one shard's owner; hints past it are dropped and counted,
    /// writes wait for room.
    pub owner_queue_depth: usize,
    /// With `backend.data_dir` (the durable store) only: the cache's warm-restart
    /// snapshot (docs/ARCHITECTURE.md, "Warm restart") is written at shutdown (SIGTERM).
    pub snapshot_on_shutdown: bool,
    /// ... and every this many seconds (0: never on a timer). `POST /snapshot` on the
    /// admin endpoint writes one on demand.
    pub snapshot_interval_s: u64,
    /// ... and loaded at start when the store's log still holds every write after it.
    pub snapshot_load: bool,
    /// Memory akerd touches and frees at start (0: none), so that the cache's first
    /// growth reuses pages already faulted in (`aker_alloc::prefault`; the allocator
    /// keeps what it frees) instead of faulting each one in during an admission or an
    /// insert (~4.5 ms per 2 MB huge page on this project's VMs). Up to the cache's peak:
    /// the pool budget, its entries and filter, and the insert log. At most the
    /// machine's memory.
    pub prefault_bytes: usize,
}

/// akerd's deliberate departures from the engine's defaults, named here and nowhere
/// else: every other `[cache]` default is `shards::CacheConfig::default()`'s, and
/// `ops/akerd.toml` states them all (a test holds it to that).
pub mod daemon_defaults {
    use shards::{Eviction, PolicyConfig, StandbySearch};

    /// Δ = 2 reserve results (engine: 0, the paper's search runs): a delete of a cached
    /// neighbour promotes a reserve instead of invalidating the entry, which a daemon
    /// that takes writes needs; 2, not more, because at equal bytes each reserve costs
    /// entries (GloVe 5%, skew 0.99: Δ 0 / 2 / 10 hold 5,253 / 4,716 / 3,457 entries,
    /// 67.6 / 66.2 / 61.6% hits: bench/results/policy-frontier.md).
    pub const DELTA: usize = 2;
    /// Neighbour vectors are not kept (engine: kept): at d = 50 a vector costs three
    /// ids-only objects, and with the guarded policy re-ranking them bought less than
    /// the entries they displace (policy-frontier.md, "akerd's configuration").
    pub const STORE_VECTORS: bool = false;
    /// Second-chance eviction (engine: FIFO, the paper's): an entry hit since the clock
    /// hand last passed it is spared, so a popular query keeps its exact answer.
    pub const EVICTION: Eviction = Eviction::SecondChance;
    /// The guarded policy (engine: paper-Aker): paper-Aker's thresholds, and an alias
    /// asked for again is promoted to an entry of its own (docs/ALGORITHM.md, "The
    /// guarded policy").
    pub fn policy() -> PolicyConfig {
        PolicyConfig::Guarded {
            alpha_l: 1.1,
            alpha_t: 0.25,
            tau_init_divisor: 4.0,
            spread: 0.0,
        }
    }
    /// `learned` (engine: `nearest`, ALGORITHM.md's rule): after a filter rotation, the
    /// generation hits come from is searched first and answers alone when it can
    /// (two-generation hits 25.9 -> 18.5 µs at d = 768, hit ratios within 0.1 point:
    /// docs/ARCHITECTURE.md, "The query filter").
    pub const STANDBY_SEARCH: StandbySearch = StandbySearch::Learned;
    /// The pool budget is bytes, 256 MiB (engine: objects, the paper's unit): an
    /// operator sizes memory, not neighbour counts.
    pub const CAPACITY_BYTES: usize = 256 << 20;
    /// Messages queued per shard owner (daemon-only).
    pub const OWNER_QUEUE_DEPTH: usize = 4096;
    /// The recall floor is on at 0.95 (engine: off): the default policy measures
    /// 0.97-0.99 on GloVe at equal bytes (bench/results/policy-frontier.md), so there
    /// the floor only costs its checks, and it catches a workload or a policy that does
    /// worse (paper-Aker: 0.92 at skew 0.99) instead of serving it silently.
    pub const RECALL_FLOOR: f64 = 0.95;
    /// Checks a second at most: ~1-3% of what one backend thread answers here, and
    /// enough for the estimate to follow a changed workload within seconds.
    pub const RECALL_CHECKS_PER_S: u32 = 200;
}

impl Default for CacheSection {
    fn default() -> Self {
        let e = CacheConfig::default();
        let f = FloorConfig::default();
        CacheSection {
            metric: None,
            k_max: e.k_max,
            delta: daemon_defaults::DELTA,
            capacity_bytes: None,
            capacity_objects: None,
            store_vectors: daemon_defaults::STORE_VECTORS,
            filter: e.filter,
            filter_candidates: e.filter_candidates,
            standby_search: daemon_defaults::STANDBY_SEARCH,
            complete_fast_path: e.complete_fast_path,
            eviction: daemon_defaults::EVICTION,
            max_aliases_per_rep: e.max_aliases_per_rep,
            slow_path_batch: e.slow_path_batch,
            slow_path_max_steps: e.slow_path_max_steps,
            risk_threshold: e.risk_threshold,
            insert_log_cap: e.insert_log_cap,
            insert_log_bytes: e.insert_log_bytes,
            delete_log_cap: e.delete_log_cap,
            policy: daemon_defaults::policy(),
            recall_floor: daemon_defaults::RECALL_FLOOR,
            recall_sample: f.sample,
            recall_checks_per_s: daemon_defaults::RECALL_CHECKS_PER_S,
            recall_scale_max: f.scale_max,
            owner_queue_depth: daemon_defaults::OWNER_QUEUE_DEPTH,
            snapshot_on_shutdown: true,
            snapshot_interval_s: 0,
            snapshot_load: true,
            prefault_bytes: 0,
        }
    }
}

/// Default pool budget when neither capacity key is set.
pub const DEFAULT_CAPACITY_BYTES: usize = daemon_defaults::CAPACITY_BYTES;

impl CacheSection {
    /// The configured metric, or the engine's default (`l2sq`).
    pub fn metric_or_default(&self) -> Metric {
        self.metric.unwrap_or(CacheConfig::default().metric)
    }

    /// The engine configuration for a collection of dimension `dim`.
    pub fn engine_config(&self, dim: usize) -> Result<CacheConfig, String> {
        let capacity = match (self.capacity_bytes, self.capacity_objects) {
            (Some(_), Some(_)) => {
                return Err("cache: set capacity_bytes or capacity_objects, not both".into())
            }
            (Some(b), None) => Capacity::Bytes(b),
            (None, Some(o)) => Capacity::Objects(o),
            (None, None) => Capacity::Bytes(DEFAULT_CAPACITY_BYTES),
        };
        let cfg = CacheConfig {
            dim,
            metric: self.metric_or_default(),
            k_max: self.k_max,
            delta: self.delta,
            capacity,
            store_vectors: self.store_vectors,
            filter: self.filter,
            filter_candidates: self.filter_candidates,
            standby_search: self.standby_search,
            complete_fast_path: self.complete_fast_path,
            eviction: self.eviction,
            max_aliases_per_rep: self.max_aliases_per_rep,
            slow_path_batch: self.slow_path_batch,
            slow_path_max_steps: self.slow_path_max_steps,
            risk_threshold: self.risk_threshold,
            insert_log_cap: self.insert_log_cap,
            insert_log_bytes: self.insert_log_bytes,
            delete_log_cap: self.delete_log_cap,
            // The no-refresh ablation is the runner's (`bench updates`), not a daemon's.
            refresh: true,
        };
        cfg.validate().map_err(|e| format!("cache: {e}"))?;
        self.policy
            .validate(cfg.metric)
            .map_err(|e| format!("cache: {e}"))?;
        if self.owner_queue_depth == 0 {
            return Err("cache: owner_queue_depth must be at least 1".into());
        }
        self.floor_config()
            .validate()
            .map_err(|e| format!("cache: {e}"))?;
        if self.recall_checks_per_s == 0 {
            return Err("cache: recall_checks_per_s must be at least 1".into());
        }
        Ok(cfg)
    }

    /// The engine's recall-floor settings (`shards::floor`).
    pub fn floor_config(&self) -> FloorConfig {
        FloorConfig {
            floor: self.recall_floor,
            sample: self.recall_sample,
            scale_max: self.recall_scale_max,
            ..FloorConfig::default()
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShardingSection {
    /// Cache shards; 0 = 2 x executors. Shard s is owned by executor s % executors.
    pub shards: usize,
    /// Coarse centroids (k-means on a sample of the collection), assigned to shards by
    /// measured load.
    pub centroids: usize,
    /// Most rows the k-means sample takes (evenly strided over the collection).
    pub sample_rows: usize,
    /// Period of the load-based centroid reassignment and pool-share rebalance (0 = never).
    pub rebalance_ms: u64,
    pub seed: u64,
}

impl Default for ShardingSection {
    fn default() -> Self {
        ShardingSection {
            shards: 0,
            centroids: 64,
            sample_rows: 20_000,
            rebalance_ms: 1_000,
            seed: 0x5eed,
        }
    }
}

impl ShardingSection {
    pub fn shard_count(&self, executors: usize) -> usize {
        if self.shards == 0 {
            2 * executors.max(1)
        } else {
            self.shards
        }
    }

    /// The engine's sharding for `shards` shards (akerd rebalances on a timer, so the
    /// engine's search-count period is unused).
    pub fn engine(&self, shards: usize) -> shards::sharded::ShardingConfig {
        shards::sharded::ShardingConfig {
            shards,
            centroids: self.centroids,
            rebalance_every: u64::MAX,
            seed: self.seed,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// An in-process index over the collection in `data`, on backend threads.
    Embedded,
    /// A PostgreSQL table with a pgvector column and its HNSW index (`[backend.pgvector]`):
    /// misses query it, writes go through it.
    Pgvector,
    /// No backend: a miss answers MISS with no neighbours and the client FILLs.
    CacheAside,
}

/// `hnsw.iterative_scan` (pgvector 0.8): whether an index scan that ran out of
/// candidates goes on searching.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IterativeScan {
    #[default]
    Off,
    StrictOrder,
    /// Results may come slightly out of order; akerd re-sorts them.
    RelaxedOrder,
}

impl IterativeScan {
    pub fn as_sql(self) -> &'static str {
        match self {
            IterativeScan::Off => "off",
            IterativeScan::StrictOrder => "strict_order",
            IterativeScan::RelaxedOrder => "relaxed_order",
        }
    }
}

/// `[backend.pgvector]`: the table akerd fronts. The connection pool is
/// `backend.threads` connections, one per backend thread.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PgvectorSection {
    /// `postgresql://user@host:port/dbname` (libpq URL or key=value form), without a
    /// password: that comes from `password_file` or `password_env`, so that neither
    /// `--print-config` nor a log line can show it.
    pub url: String,
    /// A file whose first line is the password (trailing newline ignored).
    pub password_file: Option<PathBuf>,
    /// An environment variable holding the password.
    pub password_env: Option<String>,
    /// The table, optionally schema-qualified (`public.items`).
    pub table: String,
    /// A `bigint` column with a unique index (or the primary key).
    pub id_column: String,
    /// A `vector` or `vector(n)` column with an HNSW index.
    pub vector_column: String,
    /// The dimension clients send, checked against the table at start (unset: the
    /// table's, whatever it is).
    pub dim: Option<usize>,
    /// A `bytea` column for INSERT payloads; unset, an INSERT with a payload is refused
    /// (UNSUPPORTED) rather than dropped silently.
    pub payload_column: Option<String>,
    /// `hnsw.ef_search` for every search (unset: `k_max + delta`, at least pgvector's
    /// default 40). Below `k_max + delta` it is refused unless `iterative_scan` is on:
    /// pgvector would return fewer rows than a miss asks for.
    pub ef_search: Option<usize>,
    pub iterative_scan: IterativeScan,
    /// `statement_timeout`: the longest one statement may run; a request whose deadline
    /// comes sooner has its statement cancelled at that instant.
    pub statement_timeout_ms: u64,
    /// Bound on opening one connection.
    pub connect_timeout_ms: u64,
    /// At start, how long akerd retries (with backoff) a database that cannot be
    /// reached before it gives up and exits; 0: give up at once.
    pub start_wait_ms: u64,
    /// Longest pause between reconnection attempts once running (backoff from 50 ms,
    /// doubling).
    pub reconnect_max_ms: u64,
}

impl Default for PgvectorSection {
    fn default() -> Self {
        PgvectorSection {
            url: String::new(),
            password_file: None,
            password_env: None,
            table: String::new(),
            id_column: "id".into(),
            vector_column: "embedding".into(),
            dim: None,
            payload_column: None,
            ef_search: None,
            iterative_scan: IterativeScan::Off,
            statement_timeout_ms: 5_000,
            connect_timeout_ms: 2_000,
            start_wait_ms: 30_000,
            reconnect_max_ms: 2_000,
        }
    }
}

/// `url` with any password masked as `***`: in `scheme://user:password@host` (the
/// userinfo ends at the last `@` before the path), in a `password=` query parameter, and
/// in the key=value form (`password=...` or `password = '...'`).
pub fn redact_password(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let path_at = rest.find(['/', '?']).unwrap_or(rest.len());
        let mut out = match rest[..path_at].rfind('@') {
            Some(at) => match rest[..at].find(':') {
                Some(colon) => format!("{scheme}://{}:***{}", &rest[..colon], &rest[at..]),
                None => url.to_string(),
            },
            None => url.to_string(),
        };
        if let Some(q) = out.find('?') {
            let (head, query) = out.split_at(q + 1);
            let masked: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            out = format!("{head}{}", masked.join("&"));
        }
        return out;
    }
    // key=value form: after "password", the value up to the next unquoted space.
    let lower = url.to_ascii_lowercase();
    let Some(k) = lower.find("password") else {
        return url.to_string();
    };
    let after = &url[k + "password".len()..];
    let Some(eq) = after.find('=').filter(|&e| after[..e].trim().is_empty()) else {
        return url.to_string();
    };
    let value = after[eq + 1..].trim_start();
    let value_start = url.len() - value.len();
    let value_len = if let Some(quoted) = value.strip_prefix('\'') {
        quoted.find('\'').map_or(value.len(), |e| e + 2)
    } else {
        value.find(' ').unwrap_or(value.len())
    };
    format!(
        "{}***{}",
        &url[..value_start],
        &url[value_start + value_len..]
    )
}

/// Whether `url` carries a password in any of the places [`redact_password`] masks.
pub fn url_has_password(url: &str) -> bool {
    redact_password(url) != url
}

impl PgvectorSection {
    /// `hnsw.ef_search` as sent, for a cache that asks for `k_max + delta` rows.
    pub fn effective_ef_search(&self, k_max: usize, delta: usize) -> usize {
        self.ef_search.unwrap_or((k_max + delta).max(40))
    }

    fn validate(&self, k_max: usize, delta: usize) -> Result<(), String> {
        let bad = |m: String| Err(format!("backend.pgvector: {m}"));
        if self.url.is_empty() || self.table.is_empty() {
            return bad("url and table must be set".into());
        }
        if self.id_column.is_empty() || self.vector_column.is_empty() {
            return bad("id_column and vector_column must be set".into());
        }
        // The url's full syntax is checked where it is parsed (the daemon's driver);
        // a password in it is found here, without that driver.
        if url_has_password(&self.url) {
            return bad(
                "url: holds a password; put it in password_file or password_env instead (the url is printed by --print-config)"
                    .into(),
            );
        }
        if self.password_file.is_some() && self.password_env.is_some() {
            return bad("set password_file or password_env, not both".into());
        }
        let ef = self.effective_ef_search(k_max, delta);
        if !(1..=1000).contains(&ef) {
            return bad(format!("ef_search {ef} is outside pgvector's 1..=1000"));
        }
        if ef < k_max + delta && self.iterative_scan == IterativeScan::Off {
            return bad(format!(
                "ef_search {ef} is below k_max + delta = {}: pgvector would return fewer rows than a miss asks for; raise it or set iterative_scan",
                k_max + delta
            ));
        }
        if self.statement_timeout_ms == 0 || self.connect_timeout_ms == 0 {
            return bad("statement_timeout_ms and connect_timeout_ms must be positive".into());
        }
        if self.reconnect_max_ms < 50 {
            return bad("reconnect_max_ms must be at least 50".into());
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexKind {
    /// hnsw_rs graph (approximate); the default.
    Hnsw,
    /// Brute force (exact; small collections and tests).
    Exact,
}

/// Where the collection (embedded) or the routing sample (cache-aside) comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DataSource {
    /// Clustered synthetic vectors, ids 0..n.
    Synthetic {
        n: usize,
        dim: usize,
        clusters: usize,
        seed: u64,
    },
    /// A `.npy` (float32/float16, 2-D) or `.fvecs` file; ids are row numbers. `limit`
    /// keeps the first rows only (0 = all). Relative paths are from the config file.
    File {
        path: PathBuf,
        #[serde(default)]
        limit: usize,
    },
    /// No vectors (cache-aside only): the dimension alone; the router's centroids are
    /// then random, which still routes a query and its near duplicates consistently.
    None { dim: usize },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackendSection {
    pub kind: BackendKind,
    pub data: DataSource,
    pub index: IndexKind,
    /// Backend threads (blocking calls stay off the executors).
    pub threads: usize,
    /// Backend requests queued at most; past it a request gets BUSY.
    pub queue_depth: usize,
    /// Nice value of the backend threads (0..=19; 0 leaves them alone). Misses' index
    /// searches are CPU-bound for a millisecond; at a lower priority they yield the core
    /// the moment an executor wakes to serve a hit, instead of holding it for a time slice.
    pub nice: i32,
    /// SCHED_IDLE for the backend threads: they run only on otherwise idle CPU time, so
    /// hits and the network never wait for them; under a hit load that saturates the
    /// cores, misses wait instead (bounded by their deadlines). Off by default.
    pub idle: bool,
    pub hnsw_m: usize,
    pub hnsw_ef_construction: usize,
    pub hnsw_ef_search: usize,
    /// Embedded only: where the store is durable (docs/ARCHITECTURE.md, "Durability").
    /// Unset, the store lives in memory and writes are lost at exit. Set, a write is in
    /// the directory's log, synced, before it is acknowledged; the first start imports
    /// `data` into it, later starts recover from it (and ignore `data`). Relative to the
    /// config file.
    pub data_dir: Option<PathBuf>,
    /// A checkpoint is written when the log's current segment reaches this many bytes
    /// (0: only at start, after a recovery that replayed records).
    pub checkpoint_log_bytes: u64,
    /// `kind = "pgvector"` only.
    pub pgvector: Option<PgvectorSection>,
}

impl Default for BackendSection {
    fn default() -> Self {
        BackendSection {
            kind: BackendKind::Embedded,
            data: DataSource::Synthetic {
                n: 20_000,
                dim: 32,
                clusters: 64,
                seed: 7,
            },
            index: IndexKind::Hnsw,
            threads: 2,
            queue_depth: 1024,
            nice: 10,
            idle: false,
            hnsw_m: 16,
            hnsw_ef_construction: 100,
            hnsw_ef_search: 64,
            data_dir: None,
            checkpoint_log_bytes: 64 << 20,
            pgvector: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSection {
    pub enabled: bool,
    /// Loopback unless configured otherwise: the endpoint has no authentication.
    pub listen: SocketAddr,
    /// Scrapes served at once; more wait in the kernel's backlog.
    pub max_connections: usize,
}

impl Default for AdminSection {
    fn default() -> Self {
        AdminSection {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 7701)),
            max_connections: 4,
        }
    }
}

impl Config {
    /// Parses a config file's text. An error names the line and column but does not
    /// quote the line: a secret pasted into the file by mistake (`[auth] secret = ...`)
    /// must not reach stderr or the journal.
    pub fn from_toml(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e: toml::de::Error| {
            let at = e.span().map(|s| s.start).unwrap_or(0).min(text.len());
            let before = &text[..at];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {}", e.message().trim_end())
        })
    }

    /// Reads `path`; a relative data path is made relative to the file's folder.
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut cfg = Config::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let relative = |p: &mut PathBuf| {
            if p.is_relative() {
                if let Some(dir) = path.parent() {
                    *p = dir.join(&*p);
                }
            }
        };
        if let DataSource::File { path: p, .. } = &mut cfg.backend.data {
            relative(p);
        }
        if let Some(p) = &mut cfg.backend.data_dir {
            relative(p);
        }
        if let Some(p) = &mut cfg.auth.secret_file {
            relative(p);
        }
        Ok(cfg)
    }

    /// Protected mode (`server.protected_mode`, on by default): no listening beyond
    /// loopback without authentication, and the admin endpoint (which has none) on
    /// loopback only.
    fn protected_mode(&self) -> Result<(), String> {
        if self.auth.secret_file.is_some() && self.auth.secret_env.is_some() {
            return Err("auth: set secret_file or secret_env, not both".into());
        }
        if !self.server.protected_mode {
            return Ok(());
        }
        let listen = self.server.listen.ip().to_canonical();
        if !listen.is_loopback() && !self.auth.enabled() {
            return Err(format!(
                "protected mode: refusing to listen on {listen} without authentication; set \
                 [auth] secret_file or secret_env, or server.protected_mode = false"
            ));
        }
        let admin = self.admin.listen.ip().to_canonical();
        if self.admin.enabled && !admin.is_loopback() {
            return Err(format!(
                "protected mode: the admin endpoint has no authentication and may listen on \
                 loopback only, not {admin}; or set server.protected_mode = false"
            ));
        }
        Ok(())
    }

    /// The configuration as TOML (`--print-config`), with any password written into the
    /// pgvector url (refused by `validate`, but printed before it runs) masked.
    pub fn to_toml(&self) -> String {
        let mut shown = self.clone();
        if let Some(pg) = &mut shown.backend.pgvector {
            pg.url = redact_password(&pg.url);
        }
        toml::to_string_pretty(&shown).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }

    /// Checks what can be checked before loading data.
    pub fn validate(&self) -> Result<(), String> {
        self.server.validate().map_err(|e| format!("server: {e}"))?;
        self.protected_mode()?;
        // The dimension is not known yet; 1 stands in to check the rest.
        self.cache.engine_config(1)?;
        let b = &self.backend;
        if b.threads == 0 || b.queue_depth == 0 {
            return Err("backend: threads and queue_depth must be at least 1".into());
        }
        if !(0..=19).contains(&b.nice) {
            return Err("backend: nice must be in 0..=19".into());
        }
        if b.hnsw_m == 0 || b.hnsw_ef_construction == 0 || b.hnsw_ef_search == 0 {
            return Err(
                "backend: hnsw_m, hnsw_ef_construction, hnsw_ef_search must be positive".into(),
            );
        }
        match (&b.kind, &b.pgvector) {
            (BackendKind::Pgvector, None) => {
                return Err("backend: kind = \"pgvector\" needs a [backend.pgvector] table".into())
            }
            (BackendKind::Pgvector, Some(pg)) => pg.validate(self.cache.k_max, self.cache.delta)?,
            (_, Some(_)) => {
                return Err("backend: [backend.pgvector] is for kind = \"pgvector\"".into())
            }
            (_, None) => {}
        }
        if b.data_dir.is_some() && b.kind != BackendKind::Embedded {
            return Err("backend: data_dir is for the embedded store (kind = \"embedded\")".into());
        }
        if b.kind == BackendKind::Pgvector && b.threads > 64 {
            return Err("backend: a pgvector pool of at most 64 connections (threads)".into());
        }
        match (&b.kind, &b.data) {
            (BackendKind::Embedded, DataSource::None { .. }) => {
                return Err("backend: an embedded backend needs data (synthetic or file)".into())
            }
            (
                _,
                DataSource::Synthetic {
                    n, dim, clusters, ..
                },
            ) if *n == 0 || *dim == 0 || *clusters == 0 => {
                return Err("backend.data: n, dim and clusters must be positive".into())
            }
            (_, DataSource::None { dim: 0 }) => {
                return Err("backend.data: dim must be positive".into())
            }
            _ => {}
        }
        let s = &self.sharding;
        if s.centroids == 0 || s.sample_rows == 0 {
            return Err("sharding: centroids and sample_rows must be positive".into());
        }
        if s.shard_count(self.server.executors) > 4096 {
            return Err("sharding: at most 4096 shards".into());
        }
        if self.admin.enabled && self.admin.max_connections == 0 {
            return Err("admin: max_connections must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_default_and_unknown_keys_are_refused() {
        assert_eq!(Config::from_toml("").unwrap(), Config::default());
        Config::default().validate().unwrap();
        assert!(Config::from_toml("[cache]\nno_such = 1").is_err());
        assert!(Config::from_toml("[nope]").is_err());
        assert!(Config::from_toml("[backend.data]\nkind = \"synthetic\"\nn = 1\ndim = 2\nclusters = 1\nseed = 0\nextra = 1").is_err());
    }

    #[test]
    fn sections_parse_and_round_trip() {
        let text = r#"
            [server]
            listen = "127.0.0.1:0"
            executors = 3
            cpus = [2, 3, 4]
            [cache]
            capacity_objects = 5000
            delta = 4
            filter = { kind = "brute_force" }
            policy = { kind = "proximity", threshold = 0.5 }
            [sharding]
            shards = 0
            [backend]
            kind = "cache_aside"
            data = { kind = "none", dim = 50 }
            [admin]
            enabled = false
        "#;
        let cfg = Config::from_toml(text).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.server.executors, 3);
        assert_eq!(cfg.server.cpus, vec![2, 3, 4]);
        assert_eq!(cfg.sharding.shard_count(3), 6);
        let e = cfg.cache.engine_config(50).unwrap();
        assert_eq!(e.capacity, Capacity::Objects(5000));
        assert_eq!(e.filter, FilterKind::BruteForce);
        assert_eq!(cfg.backend.data, DataSource::None { dim: 50 });
        assert_eq!(Config::from_toml(&cfg.to_toml()).unwrap(), cfg);
    }

    #[test]
    fn contradictions_are_refused() {
        let both = "[cache]\ncapacity_bytes = 1\ncapacity_objects = 1";
        assert!(Config::from_toml(both).unwrap().validate().is_err());
        let no_data = "[backend]\ndata = { kind = \"none\", dim = 4 }";
        assert!(Config::from_toml(no_data).unwrap().validate().is_err());
        let k0 = "[cache]\nk_max = 0";
        assert!(Config::from_toml(k0).unwrap().validate().is_err());
        let nice = "[backend]\nnice = 20";
        assert!(Config::from_toml(nice).unwrap().validate().is_err());
        let m1 =
            "[cache]\nfilter = { kind = \"hnsw\", m = 1, ef_construction = 8, ef_search = 16 }";
        assert!(Config::from_toml(m1).unwrap().validate().is_err());
    }

    #[test]
    fn both_graph_filters_parse() {
        let text =
            "[cache]\nfilter = { kind = \"hnsw_rs\", m = 4, ef_construction = 8, ef_search = 16 }";
        let cfg = Config::from_toml(text).unwrap();
        cfg.validate().unwrap();
        assert_eq!(
            cfg.cache.engine_config(8).unwrap().filter,
            FilterKind::HnswRs {
                m: 4,
                ef_construction: 8,
                ef_search: 16
            }
        );
        assert_eq!(Config::default().cache.filter, FilterKind::default());
        assert!(matches!(FilterKind::default(), FilterKind::Hnsw { .. }));
    }

    #[test]
    fn the_shipped_example_states_exactly_the_effective_defaults() {
        let text = include_str!("../../ops/akerd.toml");
        let mut effective = Config::default();
        // Unset by default, with their effect stated in the file: the metric of the
        // example's (embedded) backend and the byte budget.
        effective.cache.metric = Some(effective.cache.metric_or_default());
        effective.cache.capacity_bytes = Some(DEFAULT_CAPACITY_BYTES);
        // Every value as the default (compared as the config's own types: f32 stays f32)…
        assert_eq!(Config::from_toml(text).unwrap(), effective);
        // …and every key stated, none left to its default silently.
        let keys = |v: &toml::Value| -> Vec<String> {
            let mut out = Vec::new();
            for (table, t) in v.as_table().expect("a table") {
                match t.as_table() {
                    Some(t) => out.extend(t.keys().map(|k| format!("{table}.{k}"))),
                    None => out.push(table.clone()),
                }
            }
            out.sort();
            out
        };
        let shipped: toml::Value = toml::from_str(text).unwrap();
        let want = toml::Value::try_from(&effective).unwrap();
        assert_eq!(keys(&shipped), keys(&want));
    }

    #[test]
    fn a_config_error_does_not_quote_the_line() {
        // The natural mistake: the secret itself in the file.
        let e = Config::from_toml("[server]\n[auth]\nsecret = \"supersecret-value-1234\"\n")
            .unwrap_err();
        assert!(!e.contains("supersecret"), "{e}");
        assert!(e.contains("line 3") && e.contains("unknown field"), "{e}");
    }

    #[test]
    fn the_shipped_examples_parse() {
        let text = include_str!("../../ops/akerd.toml");
        let cfg = Config::from_toml(text).unwrap();
        cfg.validate().unwrap();
        let cfg = Config::from_toml(include_str!("../../ops/akerd-pgvector.toml")).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.backend.kind, BackendKind::Pgvector);
        assert_eq!(cfg.cache.metric, None, "the metric comes from the index");
    }

    #[test]
    fn the_guarded_policy_and_second_chance_eviction_reach_the_engine() {
        let cfg = Config::from_toml(
            "[cache]\neviction = \"second_chance\"\n\
             policy = { kind = \"guarded\", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }\n",
        )
        .unwrap();
        let engine = cfg.cache.engine_config(8).unwrap();
        assert_eq!(engine.eviction, Eviction::SecondChance);
        assert!(cfg.cache.policy.build().promotes_aliases());
        let bad = "[cache]\npolicy = { kind = \"guarded\", alpha_l = 1.1, alpha_t = 0.25, \
                   tau_init_divisor = 4.0, spread = -1.0 }\n";
        assert!(Config::from_toml(bad).unwrap().validate().is_err());
    }

    #[test]
    fn pgvector_settings_are_checked() {
        let base = include_str!("../../ops/akerd-pgvector.toml");
        let with = |extra: &str| -> Result<(), String> {
            Config::from_toml(&format!("{base}\n{extra}"))?.validate()
        };
        // the url is printed by --print-config: a password in it is refused
        let e = Config::from_toml(&base.replace("aker@", "aker:hunter2@"))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.contains("password_file") && !e.contains("hunter2"), "{e}");
        // ef_search below k_max + delta without an iterative scan returns short answers
        assert!(with("ef_search = 50")
            .unwrap_err()
            .contains("below k_max + delta"));
        let relaxed = base
            .replace(
                "iterative_scan = \"off\"",
                "iterative_scan = \"relaxed_order\"",
            )
            .replace("# ef_search = 110", "ef_search = 50");
        Config::from_toml(&relaxed).unwrap().validate().unwrap();
        assert!(with("password_env = \"X\"")
            .unwrap_err()
            .contains("not both"));
        // a pgvector section needs the pgvector kind, and the other way round
        let embedded = base.replace("kind = \"pgvector\"", "kind = \"embedded\"");
        assert!(Config::from_toml(&embedded).unwrap().validate().is_err());
        let bare = "[backend]\nkind = \"pgvector\"";
        assert!(Config::from_toml(bare).unwrap().validate().is_err());
        let pg = Config::from_toml(base).unwrap();
        assert_eq!(
            pg.backend.pgvector.unwrap().effective_ef_search(100, 10),
            110
        );
        // --print-config prints before validating: a password in the url is masked
        let leaky = Config::from_toml(&base.replace("aker@", "aker:hunter2@")).unwrap();
        let shown = leaky.to_toml();
        assert!(
            !shown.contains("hunter2") && shown.contains("aker:***@127.0.0.1"),
            "{shown}"
        );
        assert_eq!(redact_password("postgresql://a@h/d"), "postgresql://a@h/d");
        assert_eq!(
            redact_password("postgresql://a:p@ss@h/d"),
            "postgresql://a:***@h/d"
        );
        assert_eq!(
            redact_password("postgresql://a@h/d?password=x&sslmode=disable"),
            "postgresql://a@h/d?password=***&sslmode=disable"
        );
        assert_eq!(
            redact_password("host=db user=a password=x dbname=d"),
            "host=db user=a password=*** dbname=d"
        );
        assert_eq!(
            redact_password("host=h password = 'a b' user=u"),
            "host=h password = *** user=u"
        );
    }
}
