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
mod recall;
mod recovered;
mod snapshot;
mod warm;

pub use admin::AdminServer;
pub use backend::Store;
pub use data::Dataset;
pub use owner::ShardGauges;
pub use warm::SnapshotReport;

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
use shards::sharded::ShardSet;
use shards::store::{ExactStore, HnswStore};
use shards::{Cache, CacheConfig};

use crate::config::{BackendKind, Config, ConfigError, DataSource, IndexKind};
use crate::metrics::{ExecutorMetrics, Snapshot};
use crate::server::{Running, Server, Service, ServiceInfo};
use backend::{BackendPool, StoreSide};
use handler::AkerService;

/// Why the daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("configuration: {0}")]
    Config(#[from] crate::config::ConfigError),
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
    /// This process's MISS-token epoch (random at start: a token from before a restart
    /// names another process's delete log).
    pub(crate) token_epoch: u32,
    /// The connection layer's counters, for /metrics (STATS gets them from the server).
    pub(crate) server: std::sync::OnceLock<Server>,
    /// The recall floor (`recall.rs`): `None` when it is off or unavailable.
    pub(crate) recall: Option<Arc<recall::RecallChecks>>,
    /// A floor was asked for where there is no backend to check against (cache-aside).
    pub(crate) recall_unavailable: bool,
    /// The durable store's log and checkpoints (`backend.data_dir`), for its metrics.
    pub(crate) durable: Option<Arc<crate::durable::Durable>>,
    /// The cache's warm-restart snapshot (`warm.rs`): with the durable store only.
    pub(crate) snapshots: Option<Arc<warm::SnapshotState>>,
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
    /// Writes a snapshot every `cache.snapshot_interval_s` (stops with `backend_stop`).
    snapshot_timer: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

/// What `start_durable` hands on for the cache's warm restart.
struct Warm {
    state: Arc<warm::SnapshotState>,
    /// The snapshot to restore, when one was accepted.
    start: Option<crate::durable::snapshot::WarmStart>,
}

/// The embedded store per `cfg.backend.index` over rows with these ids.
fn build_store(cfg: &Config, dim: usize, ids: &[u64], data: &[f32]) -> Result<Store, StartError> {
    let b = &cfg.backend;
    let metric = cfg.cache.metric_or_default();
    Ok(match b.index {
        IndexKind::Exact => Box::new(ExactStore::from_rows_with_ids(dim, metric, ids, data)?),
        IndexKind::Hnsw => Box::new(HnswStore::build_with_ids(
            dim,
            metric,
            ids,
            data,
            b.hnsw_m,
            b.hnsw_ef_construction,
            b.hnsw_ef_search,
        )?),
    })
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
        // A durable store loads its data from its directory (the configured data only
        // on the first start).
        let data = match (cfg.backend.kind, &cfg.backend.data_dir) {
            (BackendKind::Embedded, Some(_)) => None,
            _ => load_data(&cfg.backend.data)?,
        };
        match (cfg.backend.kind, data) {
            (BackendKind::Embedded, _) if cfg.backend.data_dir.is_some() => {
                Daemon::start_durable(cfg)
            }
            (BackendKind::Embedded, Some(ds)) => Daemon::start_with_data(cfg, ds),
            (BackendKind::Embedded, None) => Err(StartError::Config(ConfigError::invalid(
                "backend.data",
                "an embedded backend needs data",
            ))),
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
            .ok_or_else(|| ConfigError::invalid("backend.pgvector", "is not set"))?;
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
        Daemon::start_with(
            &cfg,
            sample,
            StoreSide::Pgvector(Arc::new(target)),
            None,
            None,
        )
    }

    /// The durable embedded store (`backend.data_dir`): recovered from its directory,
    /// or, on the first start, the configured data imported into it.
    fn start_durable(cfg: &Config) -> Result<Daemon, StartError> {
        let dir = cfg
            .backend
            .data_dir
            .as_ref()
            .expect("start_durable needs data_dir");
        let metric = cfg.cache.metric_or_default();
        let lock = crate::durable::lock_dir(dir)?;
        // The dimension the config states (a synthetic set's), checked against the
        // directory's; a file's is known only by loading it, which a recovery skips.
        let dim = match cfg.backend.data {
            DataSource::Synthetic { dim, .. } => Some(dim),
            _ => None,
        };
        let r = crate::durable::recover(dir, dim, metric, || {
            let ds = load_data(&cfg.backend.data)
                .map_err(|e| e.to_string())?
                .ok_or("an embedded backend needs data")?;
            Ok((ds.dim, ds.data))
        })
        .map_err(|e| StartError::Data(e.to_string()))?;
        let rep = &r.report;
        tracing::info!(
            dir = %dir.display(),
            imported = rep.imported,
            checkpoint = ?rep.checkpoint_seq,
            records_replayed = rep.records_replayed,
            torn_bytes = rep.torn_bytes,
            checkpoints_refused = rep.refused.len(),
            rows = rep.rows,
            secs = rep.seconds,
            "durable store recovered"
        );
        // Before the checkpoint below: it may remove log segments the snapshot needs.
        let warm = Daemon::warm_start(cfg, dir, rep.imported, r.dim, r.next_seq - 1)?;
        let (store, loaded) = recovered::recovered_store(cfg, dir, &r)?;
        let durable = crate::durable::Durable::open(
            dir,
            lock,
            r.next_seq,
            metric,
            cfg.backend.checkpoint_log_bytes,
        )?;
        // The replayed log becomes a checkpoint now (the next start reads one file), and
        // a graph just built is saved (the next start loads it).
        recovered::checkpoint_at_start(dir, &durable, &store, &r, loaded)?;
        let sample = if r.ids.is_empty() {
            data::random_routing_sample(r.dim, cfg.sharding.centroids, cfg.sharding.seed)
        } else {
            Dataset::new(r.dim, r.vectors).map_err(StartError::Data)?
        };
        Daemon::start_with_durable(cfg, sample, store, Some((Arc::new(durable), warm)))
    }

    /// The data directory's collection id, and its cache snapshot if one may be used
    /// (refused with a log line otherwise: the cache then starts cold).
    fn warm_start(
        cfg: &Config,
        dir: &std::path::Path,
        imported: bool,
        dim: usize,
        last_seq: u64,
    ) -> Result<Warm, StartError> {
        use crate::durable::snapshot;
        snapshot::remove_tmp(dir);
        let collection = snapshot::collection_id(dir, imported)?;
        let metric = cfg.cache.metric_or_default().to_string();
        let engine = cfg.cache.engine_config(dim).map_err(StartError::Config)?;
        let want = snapshot::Expect {
            collection,
            dim,
            metric: &metric,
            shards: cfg.sharding.shard_count(cfg.server.executors),
            settings: crate::durable::fingerprint::settings(
                &cfg.cache.policy,
                engine.store_vectors,
            ),
            last_seq,
        };
        let state = warm::SnapshotState::new(
            dir.to_path_buf(),
            collection,
            cfg.cache.snapshot_on_shutdown,
            &cfg.cache,
            &engine,
        );
        let start = match cfg.cache.snapshot_load {
            false => None,
            true => match snapshot::load(dir, &want) {
                Ok(w) => w,
                Err(why) => {
                    state.discard(&why);
                    None
                }
            },
        };
        Ok(Warm {
            state: Arc::new(state),
            start,
        })
    }

    /// Embedded backend over `data` (ids are row numbers), index per `cfg.backend.index`.
    pub fn start_with_data(cfg: &Config, data: Dataset) -> Result<Daemon, StartError> {
        let t = Instant::now();
        let ids: Vec<u64> = (0..data.len() as u64).collect();
        let store = build_store(cfg, data.dim, &ids, &data.data)?;
        let b = &cfg.backend;
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
        match store {
            Some(s) => Daemon::start_with_durable(cfg, sample, s, None),
            None => Daemon::start_with(cfg, sample, StoreSide::CacheAside, None, None),
        }
    }

    /// An embedded `store`, with its log and checkpoints when durable.
    fn start_with_durable(
        cfg: &Config,
        sample: Dataset,
        store: Store,
        durable: Option<(Arc<crate::durable::Durable>, Warm)>,
    ) -> Result<Daemon, StartError> {
        let store = Some(store);
        let side = match store {
            Some(s) => {
                let metric = cfg.cache.metric_or_default();
                if s.dim() != sample.dim || s.metric() != metric {
                    return Err(StartError::Config(ConfigError::invalid(
                        "cache",
                        format!(
                            "store is {}-d {}, the cache {}-d {metric}",
                            s.dim(),
                            s.metric(),
                            sample.dim,
                        ),
                    )));
                }
                StoreSide::Embedded(std::sync::RwLock::new(s))
            }
            None => StoreSide::CacheAside,
        };
        let (durable, warm) = durable.unzip();
        Daemon::start_with(cfg, sample, side, durable, warm)
    }

    fn start_with(
        cfg: &Config,
        sample: Dataset,
        side: StoreSide,
        durable: Option<Arc<crate::durable::Durable>>,
        warm: Option<Warm>,
    ) -> Result<Daemon, StartError> {
        cfg.validate().map_err(StartError::Config)?;
        let dim = sample.dim;
        let cache_cfg = cfg.cache.engine_config(dim).map_err(StartError::Config)?;
        let executors = cfg.server.executors;
        let n_shards = cfg.sharding.shard_count(executors);
        let mut set = ShardSet::build(
            &cache_cfg,
            &|| cfg.cache.policy.build(),
            &cfg.sharding.engine(n_shards),
            &sample.sample(cfg.sharding.sample_rows),
        )?;
        drop(sample);
        let info = ServiceInfo {
            dim: dim as u32,
            metric: cfg.cache.metric_or_default(),
            k_max: cache_cfg.k_max as u32,
            executors: executors as u32,
            shards: n_shards as u32,
            delta: cache_cfg.delta as u32,
        };
        let snapshots = warm.map(|w| {
            if let Some(start) = w.start {
                Daemon::restore(&mut set, start, &info, &w.state);
            }
            w.state
        });
        let (router, budget) = (Arc::new(set.router), set.budget);

        let mut handles = Vec::with_capacity(n_shards);
        let mut gauges = Vec::with_capacity(n_shards);
        let mut per_executor: Vec<Vec<OwnerParts>> = (0..executors).map(|_| Vec::new()).collect();
        for (s, cache) in set.caches.into_iter().enumerate() {
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

        let floor = cfg.cache.floor_config();
        let has_store = !matches!(side, StoreSide::CacheAside);
        let recall_unavailable = floor.enabled() && !has_store;
        if recall_unavailable {
            tracing::warn!(
                floor = floor.floor,
                "cache.recall_floor is unavailable in cache-aside mode: there is no backend \
                 to check hits against"
            );
        }
        let (recall, checks) = if floor.enabled() && has_store {
            let (r, rx) = recall::RecallChecks::new(
                floor,
                cfg.cache.recall_checks_per_s,
                cfg.backend.threads,
            )
            .map_err(|e| ConfigError::invalid("cache", e))?;
            (Some(r.clone()), Some((r, rx)))
        } else {
            (None, None)
        };
        let backend_stop = Arc::new(AtomicBool::new(false));
        let (backend, backend_threads) = BackendPool::start(
            side,
            cfg.backend.threads,
            cfg.backend.queue_depth,
            cfg.backend.nice,
            cfg.backend.idle,
            handles.clone(),
            backend_stop.clone(),
            checks,
            durable.clone(),
        )?;
        let shared = Arc::new(Shared {
            info,
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
            token_epoch: rand::random(),
            server: std::sync::OnceLock::new(),
            recall,
            recall_unavailable,
            durable,
            snapshots,
        });
        // From here on, a failure must stop the backend threads: the guard does it.
        let mut daemon = Daemon {
            running: None,
            admin: None,
            backend_threads,
            backend_stop,
            snapshot_timer: None,
            shared: shared.clone(),
        };

        let secret = crate::auth::Secret::load(&cfg.auth).map_err(StartError::Config)?;
        let server = Server::with_auth(cfg.server.clone(), secret).map_err(StartError::Config)?;
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
                        let moved = shards::sharded::rebalance(
                            &sh.router,
                            &sh.budget,
                            &mut retirements,
                            |s| sh.shards[s].reader.counters().evictions.get(),
                            |s| ShardGauges::get(&sh.gauges[s].representatives),
                        );
                        sh.centroid_moves.fetch_add(moved as u64, Ordering::Relaxed);
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
            let (sh, snap) = (shared.clone(), shared.clone());
            let snapshot: Option<admin::TakeSnapshot> = shared.snapshots.is_some().then(|| {
                Arc::new(move || warm::take(&snap).map(|r| r.json())) as admin::TakeSnapshot
            });
            daemon.admin = Some(AdminServer::start(
                cfg.admin.listen,
                cfg.admin.max_connections,
                Arc::new(move || sh.prometheus()),
                snapshot,
            )?);
        }
        let every = cfg.cache.snapshot_interval_s;
        if every > 0 && shared.snapshots.is_some() {
            daemon.snapshot_timer = Some(Daemon::snapshot_timer(
                shared.clone(),
                Duration::from_secs(every),
                daemon.backend_stop.clone(),
            )?);
        }
        Ok(daemon)
    }

    /// Restores an accepted snapshot into the shards (a cold start if it fails).
    fn restore(
        set: &mut ShardSet,
        start: crate::durable::snapshot::WarmStart,
        info: &ServiceInfo,
        state: &warm::SnapshotState,
    ) {
        let t = Instant::now();
        let (seq, replayed) = (start.snapshot.seq, start.tail.len());
        match warm::restore(set, start, state, info) {
            Ok(r) => {
                state.restored.store(r.restored as u64, Ordering::Relaxed);
                tracing::info!(
                    seq,
                    entries = r.restored,
                    aliases = r.aliases,
                    refused = r.refused,
                    dropped = r.dropped,
                    writes_replayed = replayed,
                    secs = t.elapsed().as_secs_f64(),
                    "cache snapshot restored"
                );
            }
            Err(why) => state.discard(&why),
        }
    }

    /// A thread that takes a snapshot every `every` until `stop`.
    fn snapshot_timer(
        shared: Arc<Shared>,
        every: Duration,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("aker-snapshot".into())
            .spawn(move || {
                let mut next = Instant::now() + every;
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(100));
                    if Instant::now() >= next {
                        let _ = warm::take(&shared);
                        next = Instant::now() + every;
                    }
                }
            })
    }

    /// Writes the cache's snapshot now (durable store only): what `POST /snapshot` does.
    pub fn take_snapshot(&self) -> Result<SnapshotReport, String> {
        warm::take(&self.shared)
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
        // While the owners still run: the writes after it are in the log, replayed at start.
        let on_shutdown = self
            .shared
            .snapshots
            .as_ref()
            .is_some_and(|s| s.on_shutdown);
        if on_shutdown && self.running.is_some() {
            warm::take_at_shutdown(&self.shared);
        }
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
        if let Some(t) = self.snapshot_timer.take() {
            let _ = t.join();
        }
        // A checkpoint being written finishes (the next start would redo it otherwise).
        if let Some(d) = &self.shared.durable {
            d.finish();
        }
        r
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
