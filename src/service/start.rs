//! Starting a [`StartPlan`]: the steps in the order they run, each its own function.
//!
//! ```text
//!  plan ─► store side ─► shards (+ warm restore) ─► owners per executor ─► recall floor
//!       ─► server (auth) ─► backend pool (threads) ─► shared state ─► executors
//!       ─► admin endpoint ─► snapshot timer
//! ```
//!
//! Once the backend threads run, a failure must stop them: the [`Daemon`] is built right
//! after them and its `Drop` does it.

// Control plane: the caches are handed over once.
use std::sync::Mutex;

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shards::owner::{OwnerMsg, ShardHandle};
use shards::router::Retirements;
use shards::sharded::ShardSet;
use shards::{Cache, CacheConfig};

use super::backend::{BackendPool, Owners as BackendOwners, StoreSide};
use super::handler::AkerService;
use super::owner::{self, ShardGauges};
use super::pgvector::changes;
use super::plan::{self, Backing, StartPlan, Warm};
use super::recall::{Check, RecallChecks};
use super::{admin, warm, AdminServer, Daemon, Dataset, Shared, StartError, Store};
use crate::config::{ChangesMode, Config, ConfigError};
use crate::durable::Durable;
use crate::metrics::ExecutorMetrics;
use crate::server::{Running, Server, Service, ServiceInfo};

/// One shard's owner side, handed to its executor once.
struct OwnerParts {
    cache: Cache,
    rx: flume::Receiver<OwnerMsg>,
    gauges: Arc<ShardGauges>,
}

/// The shards' handles and gauges (shared), and their owner sides by executor.
struct Owners {
    handles: Vec<ShardHandle>,
    gauges: Vec<Arc<ShardGauges>>,
    per_executor: Vec<Vec<OwnerParts>>,
}

/// The recall floor's checks (`recall.rs`): the state the metrics read, and the queue
/// the backend threads take checks from.
struct Floor {
    recall: Option<Arc<RecallChecks>>,
    checks: Option<(Arc<RecallChecks>, flume::Receiver<Check>)>,
    /// A floor was asked for where there is no backend to check against (cache-aside).
    unavailable: bool,
}

impl Daemon {
    /// Plans what the config names ([`StartPlan::from_config`]) and starts it.
    pub fn start(cfg: &Config) -> Result<Daemon, StartError> {
        Daemon::start_plan(cfg, StartPlan::from_config(cfg)?)
    }

    /// Starts `plan` under `cfg`: the steps of the module doc.
    pub fn start_plan(cfg: &Config, plan: StartPlan) -> Result<Daemon, StartError> {
        let cfg = &*plan.config_for(cfg);
        cfg.validate().map_err(StartError::Config)?;
        let StartPlan {
            sample, backing, ..
        } = plan;
        let cache_cfg = cfg
            .cache
            .engine_config(sample.dim)
            .map_err(StartError::Config)?;
        let has_store = !matches!(backing, Backing::CacheAside);
        let StoreParts {
            side,
            durable,
            warm,
        } = store_side(cfg, &sample, backing)?;
        let mut set = build_shards(cfg, &cache_cfg, sample)?;
        let info = service_info(cfg, &cache_cfg);
        let snapshots = warm.map(|w| restore(&mut set, w, &info, &side));
        let restored = snapshots
            .as_ref()
            .is_some_and(|s| s.restored.load(Ordering::Relaxed) > 0);
        let owners = owners(set.caches, cfg);
        let floor = recall_floor(cfg, has_store)?;
        let server = server(cfg)?;
        // After the port is bound: a node is not announced live before it can listen.
        let joined = join_cluster(cfg, &side, &mut set.router, restored)?;
        let backend_stop = Arc::new(AtomicBool::new(false));
        let router = Arc::new(set.router);
        let follower = follow_changes(cfg, &side, &owners.handles, &router, &backend_stop)?;
        let pg_target = match &side {
            StoreSide::Pgvector(t) => Some(t.clone()),
            _ => None,
        };
        let pool = backend_pool(
            cfg,
            side,
            owners.handles.clone(),
            backend_stop.clone(),
            floor.checks,
            durable.clone(),
        );
        let (backend, mut backend_threads) = pool.inspect_err(|_| {
            backend_stop.store(true, Ordering::Release);
        })?;
        backend_threads.extend(follower);
        let mut lease = None;
        if let (Some(j), Some(t)) = (&joined, &pg_target) {
            let stop = Arc::new(AtomicBool::new(false));
            let thread = crate::cluster::start::start_lease(j, cfg, t, &stop)
                .inspect_err(|_| backend_stop.store(true, Ordering::Release))?;
            lease = Some((stop, thread));
        }
        let shared = Arc::new(Shared {
            info,
            cache_cfg,
            router,
            budget: set.budget,
            shards: owners.handles,
            gauges: owners.gauges,
            backend,
            metrics: (0..cfg.server.executors)
                .map(|_| Arc::new(ExecutorMetrics::default()))
                .collect(),
            centroid_moves: AtomicU64::new(0),
            started: Instant::now(),
            token_epoch: rand::random(),
            server_stats: server.stats_arc(),
            recall: floor.recall,
            recall_unavailable: floor.unavailable,
            durable,
            snapshots,
            cluster: joined.map(|j| j.state),
        });
        // From here on, a failure must stop the backend threads: the daemon's drop does it.
        let mut daemon = Daemon {
            running: None,
            admin: None,
            backend_threads,
            backend_stop,
            snapshot_timer: None,
            lease,
            shared: shared.clone(),
        };
        daemon.running = Some(serve(cfg, &server, &shared, owners.per_executor)?);
        daemon.admin = admin(cfg, &shared)?;
        daemon.snapshot_timer = snapshot_timer(cfg, &shared, &daemon.backend_stop)?;
        Ok(daemon)
    }
}

/// The planned store as the backend threads' side: the one place a `StoreSide` is built;
/// with the durable store's log and the warm restart's state where there are.
/// An embedded store must match the cache's dimension and metric.
fn store_side(cfg: &Config, sample: &Dataset, backing: Backing) -> Result<StoreParts, StartError> {
    let embedded = |s: Store| -> Result<StoreSide, StartError> {
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
        Ok(StoreSide::Embedded(std::sync::RwLock::new(s)))
    };
    let (side, durable, warm) = match backing {
        Backing::BuildFromSample => (embedded(plan::build_from_sample(cfg, sample)?)?, None, None),
        Backing::Embedded { store, durable } => {
            let (durable, warm) = durable.map(|d| (d.durable, d.warm)).unzip();
            (embedded(store)?, durable, warm)
        }
        Backing::Pgvector { target, warm } => (
            StoreSide::Pgvector(Arc::from(target)),
            None,
            warm.map(|w| *w),
        ),
        Backing::CacheAside => (StoreSide::CacheAside, None, None),
    };
    Ok(StoreParts {
        side,
        durable,
        warm,
    })
}

/// The store side, with the durable store's log and the warm restart's state where
/// there are.
struct StoreParts {
    side: StoreSide,
    durable: Option<Arc<Durable>>,
    warm: Option<Warm>,
}

/// The change stream of a pgvector table (`pgvector/changes/`), as
/// `backend.pgvector.changes` asks: its thread, or none. It starts before the backend
/// threads so that no write through akerd is applied outside the stream's order.
fn follow_changes(
    cfg: &Config,
    side: &StoreSide,
    shards: &[ShardHandle],
    router: &Arc<shards::router::Router>,
    stop: &Arc<AtomicBool>,
) -> Result<Option<JoinHandle<()>>, StartError> {
    let (StoreSide::Pgvector(target), Some(section)) = (side, &cfg.backend.pgvector) else {
        return Ok(None);
    };
    let instance = changes::instance_name(
        section,
        cfg.backend.data_dir.as_deref(),
        cfg.server.listen.port(),
    );
    let instance = match (instance, section.changes) {
        (Ok(name), _) => name,
        (Err(_), ChangesMode::Off) => String::new(),
        (Err(e), ChangesMode::Auto) => {
            tracing::warn!(error = %e, "pgvector: NOT following the table's changes; pg_changes_up reads 0");
            return Ok(None);
        }
        (Err(e), ChangesMode::Follow) => return Err(e),
    };
    let parts = changes::FollowParts {
        owners: BackendOwners::new(shards.to_vec()),
        router: router.clone(),
        stop: stop.clone(),
        instance,
    };
    changes::start(target.clone(), section, parts)
}

/// Joins `[cluster]` when set (pgvector only: the config check refuses the others).
fn join_cluster(
    cfg: &Config,
    side: &StoreSide,
    router: &mut shards::router::Router,
    restored: bool,
) -> Result<Option<crate::cluster::start::Joined>, StartError> {
    match side {
        StoreSide::Pgvector(t) if cfg.cluster.enabled() => {
            crate::cluster::start::join(cfg, t, router, restored).map(Some)
        }
        _ => Ok(None),
    }
}

/// The shards, the router trained on `sample` and the pool budget.
fn build_shards(
    cfg: &Config,
    cache_cfg: &CacheConfig,
    sample: Dataset,
) -> Result<ShardSet, StartError> {
    let n_shards = cfg.sharding.shard_count(cfg.server.executors);
    let set = ShardSet::build(
        cache_cfg,
        &|| cfg.cache.policy.build(),
        &cfg.sharding.engine(n_shards),
        &sample.sample(cfg.sharding.sample_rows),
    )?;
    Ok(set)
}

/// What HELLO reports and requests are validated against.
fn service_info(cfg: &Config, cache_cfg: &CacheConfig) -> ServiceInfo {
    let executors = cfg.server.executors;
    ServiceInfo {
        dim: cache_cfg.dim as u32,
        metric: cfg.cache.metric_or_default(),
        k_max: cache_cfg.k_max as u32,
        executors: executors as u32,
        shards: cfg.sharding.shard_count(executors) as u32,
        delta: cache_cfg.delta as u32,
    }
}

/// Restores an accepted snapshot into the shards (a cold start if it fails); the state
/// stays for the snapshots this run writes. A pgvector change stream whose snapshot
/// could not be restored after all starts cold.
fn restore(
    set: &mut ShardSet,
    w: Warm,
    info: &ServiceInfo,
    side: &StoreSide,
) -> Arc<warm::SnapshotState> {
    let feed = match side {
        StoreSide::Pgvector(t) => Some(&t.changes),
        _ => None,
    };
    let Some(start) = w.start else {
        return w.state;
    };
    let t = Instant::now();
    let (seq, replayed) = (start.snapshot.seq, start.tail.len());
    match warm::restore(set, start, &w.state, info) {
        Ok(r) => {
            w.state.restored.store(r.restored as u64, Ordering::Relaxed);
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
        Err(why) => {
            w.state.discard(&why);
            if let Some(feed) = feed {
                feed.start_cold();
            }
        }
    }
    w.state
}

/// Each shard's queue and gauges; its owner side goes to executor `s % executors`.
fn owners(caches: Vec<Cache>, cfg: &Config) -> Owners {
    let executors = cfg.server.executors;
    let mut o = Owners {
        handles: Vec::with_capacity(caches.len()),
        gauges: Vec::with_capacity(caches.len()),
        per_executor: (0..executors).map(|_| Vec::new()).collect(),
    };
    for (s, cache) in caches.into_iter().enumerate() {
        let (h, rx) = shards::owner::channel(&cache, cfg.cache.owner_queue_depth);
        let g = Arc::new(ShardGauges::default());
        o.handles.push(h);
        o.gauges.push(g.clone());
        o.per_executor[s % executors].push(OwnerParts {
            cache,
            rx,
            gauges: g,
        });
    }
    o
}

/// The recall floor, when one is set and there is a store to check hits against.
fn recall_floor(cfg: &Config, has_store: bool) -> Result<Floor, StartError> {
    let floor = cfg.cache.floor_config();
    let unavailable = floor.enabled() && !has_store;
    if unavailable {
        tracing::warn!(
            floor = floor.floor,
            "cache.recall_floor is unavailable in cache-aside mode: there is no backend \
             to check hits against"
        );
    }
    if !floor.enabled() || !has_store {
        return Ok(Floor {
            recall: None,
            checks: None,
            unavailable,
        });
    }
    let (r, rx) = RecallChecks::new(floor, cfg.cache.recall_checks_per_s, cfg.backend.threads)
        .map_err(|e| ConfigError::invalid("cache", e))?;
    Ok(Floor {
        recall: Some(r.clone()),
        checks: Some((r, rx)),
        unavailable,
    })
}

/// The connection layer, with its secret and TLS. Before the backend threads, so a bad
/// secret or certificate starts none.
fn server(cfg: &Config) -> Result<Server, StartError> {
    let secret = crate::auth::Secret::load(&cfg.auth).map_err(StartError::Config)?;
    let tls = match (&cfg.tls.cert_file, &cfg.tls.key_file) {
        (Some(cert), Some(key)) => {
            let files = crate::server::TlsFiles {
                cert_file: cert.clone(),
                key_file: key.clone(),
                client_ca_file: cfg.tls.client_ca_file.clone(),
            };
            let acceptor = crate::server::TlsAcceptor::new(
                files,
                std::time::Duration::from_millis(cfg.tls.handshake_timeout_ms),
                cfg.tls.handshakes_per_s_max,
            )
            .map_err(|e| StartError::Config(ConfigError::invalid("tls", e)))?;
            Some(Arc::new(acceptor))
        }
        _ => None,
    };
    Server::with_security(cfg.server.clone(), secret, tls).map_err(StartError::Config)
}

/// The backend threads over `side`: the one place `BackendPool::start` is called.
fn backend_pool(
    cfg: &Config,
    side: StoreSide,
    shards: Vec<ShardHandle>,
    stop: Arc<AtomicBool>,
    checks: Option<(Arc<RecallChecks>, flume::Receiver<Check>)>,
    durable: Option<Arc<crate::durable::Durable>>,
) -> Result<(BackendPool, Vec<JoinHandle<()>>), StartError> {
    let b = &cfg.backend;
    let pool = BackendPool::start(
        side,
        b.threads,
        b.queue_depth,
        b.nice(),
        b.idle,
        shards,
        stop,
        checks,
        durable,
    )?;
    Ok(pool)
}

/// The executors: each runs its shards' owner tasks and serves its own `AkerService`;
/// executor 0 also rebalances the router every `sharding.rebalance_ms`.
fn serve(
    cfg: &Config,
    server: &Server,
    shared: &Arc<Shared>,
    per_executor: Vec<Vec<OwnerParts>>,
) -> Result<Running, StartError> {
    let owners = Mutex::new(per_executor.into_iter().map(Some).collect::<Vec<_>>());
    let rebalance = Duration::from_millis(cfg.sharding.rebalance_ms);
    let shared = shared.clone();
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
            glommio::spawn_local(rebalance_loop(shared.clone(), rebalance)).detach();
        }
        Rc::new(AkerService::new(shared.clone(), i))
    })?;
    tracing::info!(
        addr = %running.local_addr(),
        executors = cfg.server.executors,
        shards = cfg.sharding.shard_count(cfg.server.executors),
        "akerd listening"
    );
    Ok(running)
}

/// Every `every`: centroids by load, pool shares by admissions (see `mod.rs`).
async fn rebalance_loop(sh: Arc<Shared>, every: Duration) {
    let mut retirements = Retirements::default();
    loop {
        glommio::timer::Timer::new(every).await;
        let moved = shards::sharded::rebalance(
            &sh.router,
            &sh.budget,
            &mut retirements,
            |s| sh.shards[s].reader.counters().evictions.get(),
            |s| ShardGauges::get(&sh.gauges[s].representatives),
        );
        sh.centroid_moves.fetch_add(moved as u64, Ordering::Relaxed);
    }
}

/// The admin endpoint (`GET /metrics`, `POST /snapshot` with the durable store), when
/// enabled.
fn admin(cfg: &Config, shared: &Arc<Shared>) -> Result<Option<AdminServer>, StartError> {
    if !cfg.admin.enabled {
        return Ok(None);
    }
    let (sh, snap) = (shared.clone(), shared.clone());
    let snapshot: Option<admin::TakeSnapshot> = shared
        .snapshots
        .is_some()
        .then(|| Arc::new(move || warm::take(&snap).map(|r| r.json())) as admin::TakeSnapshot);
    let server = AdminServer::start(
        cfg.admin.listen,
        cfg.admin.max_connections,
        Arc::new(move || sh.prometheus()),
        snapshot,
    )?;
    Ok(Some(server))
}

/// A thread that takes a snapshot every `cache.snapshot_interval_s` until `stop` (with
/// the durable store only).
fn snapshot_timer(
    cfg: &Config,
    shared: &Arc<Shared>,
    stop: &Arc<AtomicBool>,
) -> Result<Option<JoinHandle<()>>, StartError> {
    let every_s = cfg.cache.snapshot_interval_s;
    if every_s == 0 || shared.snapshots.is_none() {
        return Ok(None);
    }
    let every = Duration::from_secs(every_s);
    let (shared, stop) = (shared.clone(), stop.clone());
    let t = std::thread::Builder::new()
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
        })?;
    Ok(Some(t))
}
