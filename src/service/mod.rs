//! The daemon's service: the engine (`shards`) behind the connection layer
//! ([`crate::server`]), across E executors (thread per core) and S shards.
//!
//! ```text
//!                        ┌──────── executor i (glommio, one per core) ──────────────────┐
//!  client ─► connection ─┤ SEARCH: route q ─► two nearest centroids' shards [s1, s2]     │
//!                        │   probe_exact(s1, s2) ─► probe_filter(s1, s2)   (lock-free,   │
//!                        │   on this core, no cross-core hop)                             │
//!                        │   hit ──► reply ── LinkAlias / slow-path credit ─► hint ──┐    │
//!                        │   miss ─► ticket(s1) ─► backend queue ─┐                  │    │
//!                        │          reply top-k ◄─ await k+Δ ◄────┤                  │    │
//!                        │          Admit ─────────────────────── ─► hint ───────────┤    │
//!                        │ INSERT / DELETE ─► backend queue ──────┤  (dropped and    │    │
//!                        │   await every owner's ack ◄─────────┐  │   counted when   │    │
//!                        │ FILL (cache-aside) ─► Admit, await ack │   a queue is full)│    │
//!                        │ owner tasks: shards s with s % E == i  │                  ▼    │
//!                        │   loop { msg = rx.recv_async(); cache.apply(msg) }  ◄── bounded│
//!                        └────────────────────────────────────────┼───────── queues ──────┘
//!                                                                 ▼
//!            backend threads (N): the embedded store (HNSW / exact) under an RwLock,
//!            or one pgvector connection each (no store-wide lock: a write holds its
//!            id's stripe); a write applies to the store, then queues Insert / Delete to
//!            every owner under that lock (owners see writes to an id in the store's
//!            order); replies on bounded(1).
//!  executor 0, every rebalance_ms: router.rebalance() (centroids by load; a moved
//!                                  centroid's old shard stays probed until its
//!                                  entries age out: router::Retirements),
//!                                  budget.rebalance() (pool shares follow admissions)
//!  admin thread(s): GET /metrics ─► Snapshot (engine counters, owner gauges, histograms)
//! ```
//!
//! Why this shape:
//! - Hits never leave the request's core and take no lock of ours: the shards' read
//!   sides are shared (`CacheReader`, papaya maps, epochs); owner work a hit implies
//!   (alias links, slow-path credit) is a best-effort hint.
//! - Every shard has exactly one writer, a task on its executor; other cores reach it
//!   only through its bounded queue.
//! - A miss takes its ticket (insert / delete sequence numbers) before the backend call,
//!   so an admission never brings back an id deleted while the miss was in flight.
//! - A DELETE is acknowledged only after every owner applied it, and the queued messages
//!   survive the client's deadline, so the cache never keeps an id the store dropped.
//! - Blocking calls (the store) run on their own threads; executors only await channels.

mod admin;
mod backend;
pub mod data;
mod handler;
mod owner;
pub mod pgvector;

pub use admin::AdminServer;
pub use backend::Store;
pub use data::Dataset;
pub use owner::ShardGauges;

#[allow(clippy::disallowed_types)] // control plane: the caches are handed over once.
use std::sync::Mutex;

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shards::budget::GlobalBudget;
use shards::owner::{OwnerMsg, ShardHandle};
use shards::router::{Retirements, Router};
use shards::store::{ExactStore, HnswStore};
use shards::{Cache, CacheConfig, Capacity};

use crate::config::{BackendKind, Config, DataSource, IndexKind};
use crate::metrics::{self, ExecutorMetrics, Latency, Op, SampleKind, Snapshot, KIND_NAMES};
use crate::server::{Running, Server, Service, ServiceInfo};
use backend::{BackendPool, StoreSide};
use handler::AkerService;

/// Why the daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("data: {0}")]
    Data(String),
    #[error("engine: {0}")]
    Engine(#[from] shards::Error),
    /// The backend database refused or could not be reached.
    #[error("backend: {0}")]
    Backend(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// What every executor (and the admin endpoint) shares.
pub(crate) struct Shared {
    pub(crate) cache_cfg: CacheConfig,
    pub(crate) info: ServiceInfo,
    pub(crate) router: Arc<Router>,
    pub(crate) budget: Arc<GlobalBudget>,
    pub(crate) shards: Vec<ShardHandle>,
    pub(crate) gauges: Vec<Arc<ShardGauges>>,
    pub(crate) backend: BackendPool,
    /// One per executor.
    pub(crate) metrics: Vec<Arc<ExecutorMetrics>>,
    pub(crate) centroid_moves: AtomicU64,
    pub(crate) started: Instant,
    /// The connection layer's counters, for /metrics (STATS gets them from the server).
    pub(crate) server: std::sync::OnceLock<Server>,
}

/// One shard's owner side, handed to its executor once.
struct OwnerParts {
    cache: Cache,
    rx: flume::Receiver<OwnerMsg>,
    gauges: Arc<ShardGauges>,
}

/// A running daemon: executors, backend threads and the admin endpoint.
pub struct Daemon {
    running: Option<Running>,
    admin: Option<AdminServer>,
    backend_threads: Vec<JoinHandle<()>>,
    backend_stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
}

/// Loads the collection (or the routing sample) a config names.
pub fn load_data(source: &DataSource) -> Result<Option<Dataset>, StartError> {
    Ok(match source {
        DataSource::Synthetic {
            n,
            dim,
            clusters,
            seed,
        } => Some(aker_formats::data::synthetic(*n, *dim, *clusters, *seed)),
        DataSource::File { path, limit } => {
            let mut ds = data::load(path).map_err(StartError::Data)?;
            if *limit > 0 {
                ds.truncate(*limit);
            }
            if ds.is_empty() {
                return Err(StartError::Data(format!(
                    "{} holds no vectors",
                    path.display()
                )));
            }
            Some(ds)
        }
        DataSource::None { .. } => None,
    })
}

impl Daemon {
    /// Loads the data the config names, builds the store and starts everything.
    pub fn start(cfg: &Config) -> Result<Daemon, StartError> {
        cfg.validate().map_err(StartError::Config)?;
        let data = load_data(&cfg.backend.data)?;
        match (cfg.backend.kind, data) {
            (BackendKind::Embedded, Some(ds)) => Daemon::start_with_data(cfg, ds),
            (BackendKind::Embedded, None) => {
                Err(StartError::Config("an embedded backend needs data".into()))
            }
            (BackendKind::CacheAside, Some(ds)) => Daemon::start_with_backend(cfg, ds, None),
            (BackendKind::CacheAside, None) => {
                let DataSource::None { dim } = cfg.backend.data else {
                    unreachable!("only DataSource::None loads nothing")
                };
                let ds =
                    data::random_routing_sample(dim, cfg.sharding.centroids, cfg.sharding.seed);
                Daemon::start_with_backend(cfg, ds, None)
            }
            (BackendKind::Pgvector, _) => Daemon::start_pgvector(cfg),
        }
    }

    /// In front of a PostgreSQL table: waits for the database as configured, checks the
    /// table and its index, takes the metric from the index and trains the router on a
    /// sample of the table.
    fn start_pgvector(cfg: &Config) -> Result<Daemon, StartError> {
        let section = cfg
            .backend
            .pgvector
            .as_ref()
            .ok_or_else(|| StartError::Config("backend.pgvector is not set".into()))?;
        let (target, sample) = pgvector::start(
            section,
            cfg.cache.metric,
            cfg.cache.k_max,
            cfg.cache.delta,
            cfg.cache.store_vectors,
            cfg.sharding.sample_rows,
        )?;
        let sample = sample.unwrap_or_else(|| {
            tracing::warn!(table = %target.table, "pgvector: the table is empty; routing centroids are random");
            data::random_routing_sample(target.dim, cfg.sharding.centroids, cfg.sharding.seed)
        });
        let mut cfg = cfg.clone();
        cfg.cache.metric = Some(target.metric);
        Daemon::start_with(&cfg, sample, StoreSide::Pgvector(Arc::new(target)))
    }

    /// Embedded backend over `data` (ids are row numbers), index per `cfg.backend.index`.
    pub fn start_with_data(cfg: &Config, data: Dataset) -> Result<Daemon, StartError> {
        let b = &cfg.backend;
        let t = Instant::now();
        let store: Store = match b.index {
            IndexKind::Exact => Box::new(ExactStore::from_rows(
                data.dim,
                cfg.cache.metric_or_default(),
                &data.data,
            )?),
            IndexKind::Hnsw => Box::new(HnswStore::build(
                data.dim,
                cfg.cache.metric_or_default(),
                &data.data,
                b.hnsw_m,
                b.hnsw_ef_construction,
                b.hnsw_ef_search,
            )?),
        };
        tracing::info!(
            vectors = data.len(),
            dim = data.dim,
            index = ?b.index,
            secs = t.elapsed().as_secs_f64(),
            "embedded store built"
        );
        Daemon::start_with_backend(cfg, data, Some(store))
    }

    /// The general form: `sample` trains the router (and gives the dimension); `store` is
    /// the backend (`None`: cache-aside, the client FILLs misses). Tests pass their own
    /// stores here (e.g. a deliberately slow one).
    pub fn start_with_backend(
        cfg: &Config,
        sample: Dataset,
        store: Option<Store>,
    ) -> Result<Daemon, StartError> {
        let side = match store {
            Some(s) => {
                let metric = cfg.cache.metric_or_default();
                if s.dim() != sample.dim || s.metric() != metric {
                    return Err(StartError::Config(format!(
                        "store is {}-d {}, the cache {}-d {metric}",
                        s.dim(),
                        s.metric(),
                        sample.dim,
                    )));
                }
                StoreSide::Embedded(std::sync::RwLock::new(s))
            }
            None => StoreSide::CacheAside,
        };
        Daemon::start_with(cfg, sample, side)
    }

    fn start_with(cfg: &Config, sample: Dataset, side: StoreSide) -> Result<Daemon, StartError> {
        cfg.validate().map_err(StartError::Config)?;
        let dim = sample.dim;
        let cache_cfg = cfg.cache.engine_config(dim).map_err(StartError::Config)?;
        let executors = cfg.server.executors;
        let n_shards = cfg.sharding.shard_count(executors);
        let router = Arc::new(Router::train(
            &sample.sample(cfg.sharding.sample_rows),
            dim,
            cfg.cache.metric_or_default(),
            cfg.sharding.centroids,
            n_shards,
            cfg.sharding.seed,
        )?);
        drop(sample);
        let total = match cache_cfg.capacity {
            Capacity::Objects(n) | Capacity::Bytes(n) => n,
        };
        let budget = Arc::new(GlobalBudget::new(total, n_shards));

        let mut handles = Vec::with_capacity(n_shards);
        let mut gauges = Vec::with_capacity(n_shards);
        let mut per_executor: Vec<Vec<OwnerParts>> = (0..executors).map(|_| Vec::new()).collect();
        for s in 0..n_shards {
            let cache = Cache::with_budget(
                cache_cfg.clone(),
                cfg.cache.policy.build(),
                budget.clone(),
                s,
            )?;
            let (h, rx) = shards::owner::channel(&cache, cfg.cache.owner_queue_depth);
            let g = Arc::new(ShardGauges::default());
            handles.push(h);
            gauges.push(g.clone());
            per_executor[s % executors].push(OwnerParts {
                cache,
                rx,
                gauges: g,
            });
        }

        let backend_stop = Arc::new(AtomicBool::new(false));
        let (backend, backend_threads) = BackendPool::start(
            side,
            cfg.backend.threads,
            cfg.backend.queue_depth,
            cfg.backend.nice,
            cfg.backend.idle,
            handles.clone(),
            backend_stop.clone(),
        )?;
        let shared = Arc::new(Shared {
            info: ServiceInfo {
                dim: dim as u32,
                metric: cfg.cache.metric_or_default(),
                k_max: cache_cfg.k_max as u32,
                executors: executors as u32,
                shards: n_shards as u32,
            },
            cache_cfg,
            router,
            budget,
            shards: handles,
            gauges,
            backend,
            metrics: (0..executors)
                .map(|_| Arc::new(ExecutorMetrics::default()))
                .collect(),
            centroid_moves: AtomicU64::new(0),
            started: Instant::now(),
            server: std::sync::OnceLock::new(),
        });
        // From here on, a failure must stop the backend threads: the guard does it.
        let mut daemon = Daemon {
            running: None,
            admin: None,
            backend_threads,
            backend_stop,
            shared: shared.clone(),
        };

        let server = Server::new(cfg.server.clone()).map_err(StartError::Config)?;
        let _ = shared.server.set(server.clone());
        let owners = Mutex::new(per_executor.into_iter().map(Some).collect::<Vec<_>>());
        let rebalance = Duration::from_millis(cfg.sharding.rebalance_ms);
        let factory_shared = shared.clone();
        let running = server.start(move |i| -> Rc<dyn Service> {
            let parts = owners
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(i)
                .and_then(Option::take)
                .unwrap_or_default();
            for p in parts {
                glommio::spawn_local(owner::run(p.cache, p.rx, p.gauges)).detach();
            }
            if i == 0 && !rebalance.is_zero() {
                let sh = factory_shared.clone();
                glommio::spawn_local(async move {
                    let mut retirements = Retirements::default();
                    loop {
                        glommio::timer::Timer::new(rebalance).await;
                        let moves = sh.router.rebalance();
                        let evictions = |s: usize| sh.shards[s].reader.counters().evictions.get();
                        let entries = |s: usize| ShardGauges::get(&sh.gauges[s].representatives);
                        retirements.moved(&moves, evictions, entries);
                        retirements.retire(&sh.router, evictions);
                        sh.budget.rebalance();
                        sh.centroid_moves
                            .fetch_add(moves.len() as u64, Ordering::Relaxed);
                    }
                })
                .detach();
            }
            Rc::new(AkerService::new(factory_shared.clone(), i))
        })?;
        tracing::info!(
            addr = %running.local_addr(),
            executors,
            shards = n_shards,
            "akerd listening"
        );
        daemon.running = Some(running);

        if cfg.admin.enabled {
            let sh = shared.clone();
            daemon.admin = Some(AdminServer::start(
                cfg.admin.listen,
                cfg.admin.max_connections,
                Arc::new(move || sh.prometheus()),
            )?);
        }
        Ok(daemon)
    }

    /// The address every executor listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.running.as_ref().expect("running").local_addr()
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(AdminServer::local_addr)
    }

    pub fn server(&self) -> &Server {
        self.running.as_ref().expect("running").server()
    }

    /// What STATS shows (without the connection layer's lines).
    pub fn snapshot(&self) -> Snapshot {
        self.shared.snapshot()
    }

    /// The body of `GET /metrics`.
    pub fn prometheus(&self) -> String {
        self.shared.prometheus()
    }

    /// Stops accepting, lets in-flight requests answer (the server's grace period), then
    /// stops the admin endpoint and the backend threads.
    pub fn stop(mut self) -> std::io::Result<()> {
        self.shutdown()
    }

    /// Waits until someone calls `server().shutdown()`, then stops the rest.
    pub fn join(mut self) -> std::io::Result<()> {
        let r = match self.running.take() {
            Some(r) => r.join(),
            None => Ok(()),
        };
        let rest = self.shutdown();
        r.and(rest)
    }

    fn shutdown(&mut self) -> std::io::Result<()> {
        let r = match self.running.take() {
            Some(r) => r.stop(),
            None => Ok(()),
        };
        if let Some(a) = self.admin.take() {
            a.stop();
        }
        self.backend_stop.store(true, Ordering::Release);
        for t in self.backend_threads.drain(..) {
            let _ = t.join();
        }
        r
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

impl Shared {
    /// Engine counters (summed over shards), owner gauges, service counters and merged
    /// latency histograms, at one moment.
    pub(crate) fn snapshot(&self) -> Snapshot {
        use SampleKind::{Counter, Gauge};
        let mut s = Snapshot::default();
        s.gauge(
            "executors",
            "Executors (cores) serving.",
            self.info.executors as f64,
        );
        s.gauge("shards", "Cache shards.", self.shards.len() as f64);
        s.gauge(
            "uptime_seconds",
            "Seconds since start.",
            self.started.elapsed().as_secs_f64().floor(),
        );

        macro_rules! engine {
            ($($field:ident => $name:literal, $help:literal;)*) => {
                $(
                    let v: u64 = self.shards.iter().map(|h| h.reader.counters().$field.get()).sum();
                    s.counter($name, $help, v);
                )*
            };
        }
        engine! {
            lookups => "lookups", "Cache lookups (SEARCH without BYPASS_CACHE / REFRESH_ENTRY).";
            exact_hits => "hits_exact", "Equality hits on a representative.";
            alias_hits => "hits_alias", "Hits through an alias.";
            approximate_hits => "hits_approximate", "Approximate hits (a near representative within its threshold).";
            misses => "misses", "Lookups answered by the backend (or, cache-aside, by the client).";
            verifications => "verifications", "Hits turned into verifying misses (Potluck+).";
            admissions => "admissions", "Representatives admitted.";
            admissions_refused => "admissions_refused", "Admissions refused (too few results left, stale, too large).";
            evictions => "evictions", "FIFO evictions.";
            invalidations => "invalidations", "Entries invalidated (deletes, replacement, FLUSH).";
            log_cap_invalidations => "log_cap_invalidations", "Entries invalidated by the insert log's length cap.";
            delete_repairs => "delete_repairs", "Entries that promoted a reserve result after a delete.";
            fast_path_updates => "fast_path_updates", "Inserts merged by the fast path.";
            slow_path_steps => "slow_path_steps", "Slow-path refresh steps.";
            slow_path_merges => "slow_path_merges", "Inserts merged by the slow path.";
            aliases_linked => "aliases_linked", "Aliases linked after approximate hits.";
        }

        let g = |f: fn(&ShardGauges) -> &AtomicU64| -> Vec<u64> {
            self.gauges.iter().map(|x| ShardGauges::get(f(x))).collect()
        };
        let objects = g(|x| &x.objects);
        let bytes = g(|x| &x.bytes);
        s.gauge(
            "pool_objects",
            "Neighbour objects held, all shards.",
            objects.iter().sum::<u64>() as f64,
        );
        s.gauge(
            "pool_bytes",
            "Bytes held (objects, representatives, aliases), all shards.",
            bytes.iter().sum::<u64>() as f64,
        );
        s.gauge(
            "pool_capacity",
            "The global pool budget (bytes or objects, per the config).",
            self.budget.total() as f64,
        );
        s.gauge(
            "representatives",
            "Representative entries, all shards.",
            g(|x| &x.representatives).iter().sum::<u64>() as f64,
        );
        s.gauge(
            "aliases",
            "Alias entries, all shards.",
            g(|x| &x.aliases).iter().sum::<u64>() as f64,
        );
        let dropped: Vec<u64> = self.shards.iter().map(|h| h.dropped()).collect();
        s.counter(
            "hints_dropped",
            "Owner hints (alias links, slow-path credit, admissions) dropped on a full queue.",
            dropped.iter().sum(),
        );
        s.gauge(
            "backend_queue_len",
            "Backend requests queued.",
            self.backend.queue_len() as f64,
        );
        s.counter(
            "router_rebalances",
            "Load-based centroid reassignments.",
            self.router.rebalances(),
        );
        s.counter(
            "router_centroids_moved",
            "Centroids moved to another shard by rebalancing.",
            self.centroid_moves.load(Ordering::Relaxed),
        );
        s.gauge(
            "router_previous_shards",
            "Moved centroids whose old shard lookups still probe (until its entries age out).",
            self.router.previous_count() as f64,
        );

        let recorded = metrics::merge_all(self.metrics.iter().map(|m| &**m));
        let c = &recorded.counters;
        for op in Op::ALL {
            s.push(
                "requests",
                "Requests the service handled, by operation.",
                Counter,
                vec![("op", op.name().into())],
                c.requests[op as usize] as f64,
            );
        }
        for op in Op::ALL {
            s.push(
                "errors",
                "Requests answered with an error, by operation.",
                Counter,
                vec![("op", op.name().into())],
                c.errors[op as usize] as f64,
            );
        }
        s.counter(
            "searches_bypass",
            "SEARCH with BYPASS_CACHE.",
            c.searches_bypass,
        );
        s.counter(
            "searches_refresh",
            "SEARCH with REFRESH_ENTRY.",
            c.searches_refresh,
        );
        s.counter(
            "backend_busy",
            "Requests refused with BUSY: backend queue full.",
            c.backend_busy,
        );
        s.counter(
            "backend_errors",
            "Backend calls that failed.",
            c.backend_errors,
        );
        s.counter(
            "fills_admitted",
            "FILLs the cache admitted.",
            c.fills_admitted,
        );
        s.counter(
            "backend_short_answers",
            "Misses the backend answered with fewer rows than asked (served, not admitted).",
            c.backend_short_answers,
        );
        if let Some(pg) = self.backend.pgvector() {
            let st = &pg.stats;
            s.gauge(
                "pg_connections_up",
                "pgvector: backend threads holding a live database connection.",
                st.connections_up.load(Ordering::Relaxed) as f64,
            );
            type PgCounter = (
                &'static str,
                &'static str,
                fn(&pgvector::PgStats) -> &AtomicU64,
            );
            let counters: [PgCounter; 6] = [
                (
                    "pg_reconnects",
                    "pgvector: connections reopened after one was lost.",
                    |x| &x.reconnects,
                ),
                (
                    "pg_connect_failures",
                    "pgvector: connection attempts that failed.",
                    |x| &x.connect_failures,
                ),
                (
                    "pg_statement_timeouts",
                    "pgvector: statements cancelled at their request's deadline.",
                    |x| &x.statement_timeouts,
                ),
                (
                    "pg_rows_skipped",
                    "pgvector: rows left out of answers (a negative id, or no finite distance).",
                    |x| &x.rows_skipped,
                ),
                (
                    "pg_writes_in_doubt",
                    "pgvector: writes whose commit was in doubt (connection lost, no answer); \
                     their ids were dropped from the cache and their sessions ended.",
                    |x| &x.writes_in_doubt,
                ),
                (
                    "pg_writes_unsettled",
                    "pgvector: writes in doubt whose server session could not be confirmed gone.",
                    |x| &x.writes_unsettled,
                ),
            ];
            for (name, help, field) in counters {
                s.counter(name, help, field(st).load(Ordering::Relaxed));
            }
        }

        type Per = (&'static str, &'static str, fn(&ShardGauges) -> f64);
        let per_shard: [Per; 11] = [
            ("shard_pool_objects", "Neighbour objects per shard.", |x| {
                ShardGauges::get(&x.objects) as f64
            }),
            ("shard_pool_bytes", "Bytes held per shard.", |x| {
                ShardGauges::get(&x.bytes) as f64
            }),
            ("shard_representatives", "Representatives per shard.", |x| {
                ShardGauges::get(&x.representatives) as f64
            }),
            ("shard_aliases", "Aliases per shard.", |x| {
                ShardGauges::get(&x.aliases) as f64
            }),
            (
                "shard_insert_log_len",
                "Insert log records held per shard.",
                |x| ShardGauges::get(&x.insert_log_len) as f64,
            ),
            ("shard_risk", "Refresh risk R per shard.", |x| x.risk()),
            ("shard_filter_live", "Live filter points per shard.", |x| {
                ShardGauges::get(&x.filter_live) as f64
            }),
            (
                "shard_filter_tombstones",
                "Filter tombstones per shard.",
                |x| ShardGauges::get(&x.filter_tombstones) as f64,
            ),
            (
                "shard_filter_rotations",
                "Filter generation rotations per shard.",
                |x| ShardGauges::get(&x.filter_rotations) as f64,
            ),
            (
                "shard_filter_standby_live",
                "Live entries of the standby filter generation per shard (above 0, \
                 lookups search two generations).",
                |x| ShardGauges::get(&x.filter_standby_live) as f64,
            ),
            (
                "shard_filter_standby_moved",
                "Standby filter entries moved into the active generation in idle time.",
                |x| ShardGauges::get(&x.filter_standby_moved) as f64,
            ),
        ];
        for (family, help, f) in per_shard {
            for (i, x) in self.gauges.iter().enumerate() {
                s.push(family, help, Gauge, vec![("shard", i.to_string())], f(x));
            }
        }
        for (i, h) in self.shards.iter().enumerate() {
            let l = vec![("shard", i.to_string())];
            s.push(
                "shard_share",
                "Pool budget share per shard.",
                Gauge,
                l.clone(),
                self.budget.share(i) as f64,
            );
            s.push(
                "shard_queue_len",
                "Owner queue length per shard.",
                Gauge,
                l.clone(),
                h.queue_len() as f64,
            );
            s.push(
                "shard_hints_dropped",
                "Hints dropped per shard.",
                Counter,
                l.clone(),
                dropped[i] as f64,
            );
            s.push(
                "shard_messages",
                "Owner messages applied per shard.",
                Counter,
                l,
                ShardGauges::get(&self.gauges[i].messages) as f64,
            );
        }

        for op in Op::ALL {
            s.latencies.push(Latency {
                op: op.name(),
                kind: None,
                hist: recorded.ops[op as usize].clone(),
            });
        }
        for (k, name) in KIND_NAMES.iter().enumerate() {
            s.latencies.push(Latency {
                op: "search",
                kind: Some(name),
                hist: recorded.kinds[k].clone(),
            });
        }
        s.latencies.push(Latency {
            op: "backend_search",
            kind: None,
            hist: recorded.backend,
        });
        s
    }

    /// Prometheus text: the snapshot plus the connection layer's counters.
    pub(crate) fn prometheus(&self) -> String {
        let mut extra = Vec::new();
        if let Some(server) = self.server.get() {
            let mut text = String::new();
            server.stats().render(&mut text);
            for line in text.lines() {
                if let Some((name, v)) = line.split_once(' ') {
                    if let Ok(v) = v.trim().parse::<f64>() {
                        let kind = if name == "server_connections_current" {
                            SampleKind::Gauge
                        } else {
                            SampleKind::Counter
                        };
                        extra.push((name.to_string(), kind, v));
                    }
                }
            }
        }
        self.snapshot().render_prometheus(&extra)
    }
}
