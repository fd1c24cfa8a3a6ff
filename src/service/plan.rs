//! What a daemon serves, decided before anything starts: a [`StartPlan`] holds the
//! router's training sample (which also gives the dimension) and the store behind the
//! cache, with the durable store's log and warm snapshot when it has them.
//!
//! [`StartPlan::from_config`] is the one place a config becomes a plan (load the data,
//! recover the durable store, or check the pgvector table); tests build plans around
//! their own stores ([`StartPlan::embedded`], e.g. a deliberately slow one), and
//! [`super::Daemon::start_plan`] starts any of them the same way.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use shards::store::{ExactStore, HnswStore};
use shards::Metric;

use super::pgvector::{self, changes, PgTarget};
use super::{data, recovered, warm, Dataset, StartError, Store};
use crate::config::{
    BackendKind, ChangesMode, Config, ConfigError, DataSource, IndexKind, PgvectorSection,
};
use crate::durable::snapshot::WarmStart;
use crate::durable::Durable;

/// What to serve: see the module doc.
pub struct StartPlan {
    /// Trains the router and gives the dimension; dropped once the shards are built.
    pub(crate) sample: Dataset,
    pub(crate) backing: Backing,
    /// The metric the store decided (pgvector: its index's), over `cache.metric`.
    pub(crate) metric: Option<Metric>,
}

/// The store behind the cache, as planned (`start.rs` turns it into the backend's side).
pub(crate) enum Backing {
    /// An embedded store built over the sample at start (ids are row numbers).
    BuildFromSample,
    /// An embedded store already built; with its log, checkpoints and warm snapshot when
    /// durable (`backend.data_dir`; boxed: a snapshot to restore is large).
    Embedded {
        store: Store,
        durable: Option<Box<DurableStart>>,
    },
    /// A PostgreSQL table, checked at plan time (boxed: it is large); with its cache's
    /// warm restart when it has a `backend.data_dir` and follows the table's changes.
    Pgvector {
        target: Box<PgTarget>,
        warm: Option<Box<Warm>>,
    },
    /// No store: the client FILLs misses.
    CacheAside,
}

/// The durable store's log and checkpoints, and what its cache's warm restart needs.
pub(crate) struct DurableStart {
    pub(crate) durable: Arc<Durable>,
    pub(crate) warm: Warm,
}

/// What the warm restart hands on: its state, and the snapshot to restore when one was
/// accepted.
pub(crate) struct Warm {
    pub(crate) state: Arc<warm::SnapshotState>,
    pub(crate) start: Option<WarmStart>,
}

impl StartPlan {
    /// An embedded store built at start over `data` (ids are row numbers, index per
    /// `backend.index`); `data` also trains the router.
    pub fn with_data(data: Dataset) -> StartPlan {
        StartPlan::new(data, Backing::BuildFromSample)
    }

    /// An embedded `store` the caller built (tests pass their own stores here, e.g. a
    /// deliberately slow one); `sample` trains the router and must match its dimension.
    pub fn embedded(sample: Dataset, store: Store) -> StartPlan {
        let backing = Backing::Embedded {
            store,
            durable: None,
        };
        StartPlan::new(sample, backing)
    }

    /// No store: the client FILLs misses; `sample` trains the router.
    pub fn cache_aside(sample: Dataset) -> StartPlan {
        StartPlan::new(sample, Backing::CacheAside)
    }

    fn new(sample: Dataset, backing: Backing) -> StartPlan {
        StartPlan {
            sample,
            backing,
            metric: None,
        }
    }

    /// What `cfg` names: loads its data, recovers the durable store from its directory,
    /// or checks the pgvector table.
    pub fn from_config(cfg: &Config) -> Result<StartPlan, StartError> {
        cfg.validate().map_err(StartError::Config)?;
        let b = &cfg.backend;
        match (b.kind, &b.data_dir) {
            // A durable store loads its data from its directory (the configured data
            // only on the first start).
            (BackendKind::Embedded, Some(dir)) => durable_plan(cfg, dir),
            (BackendKind::Embedded, None) => match load_data(&b.data)? {
                Some(ds) => Ok(StartPlan::with_data(ds)),
                None => Err(StartError::Config(ConfigError::invalid(
                    "backend.data",
                    "an embedded backend needs data",
                ))),
            },
            (BackendKind::CacheAside, _) => {
                let sample = match &b.data {
                    DataSource::None { dim } => {
                        data::random_routing_sample(*dim, cfg.sharding.centroids, cfg.sharding.seed)
                    }
                    // Only `DataSource::None` loads nothing.
                    source => load_data(source)?.ok_or_else(|| {
                        StartError::Config(ConfigError::invalid("backend.data", "loaded nothing"))
                    })?,
                };
                Ok(StartPlan::cache_aside(sample))
            }
            (BackendKind::Pgvector, _) => pgvector_plan(cfg),
        }
    }

    /// `cfg` as this plan serves it: with the store's metric where it decided one.
    pub(crate) fn config_for<'a>(&self, cfg: &'a Config) -> std::borrow::Cow<'a, Config> {
        match self.metric {
            None => std::borrow::Cow::Borrowed(cfg),
            Some(m) => {
                let mut cfg = cfg.clone();
                cfg.cache.metric = Some(m);
                std::borrow::Cow::Owned(cfg)
            }
        }
    }
}

/// Loads the collection (or the routing sample) a config names.
pub(crate) fn load_data(source: &DataSource) -> Result<Option<Dataset>, StartError> {
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

/// The embedded store per `cfg.backend.index` over rows with these ids.
pub(crate) fn build_store(
    cfg: &Config,
    dim: usize,
    ids: &[u64],
    data: &[f32],
) -> Result<Store, StartError> {
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

/// The embedded store over `data` (ids are row numbers), with a log line of its build.
pub(crate) fn build_from_sample(cfg: &Config, data: &Dataset) -> Result<Store, StartError> {
    let t = Instant::now();
    let ids: Vec<u64> = (0..data.len() as u64).collect();
    let store = build_store(cfg, data.dim, &ids, &data.data)?;
    tracing::info!(
        vectors = data.len(),
        dim = data.dim,
        index = ?cfg.backend.index,
        secs = t.elapsed().as_secs_f64(),
        "embedded store built"
    );
    Ok(store)
}

/// In front of a PostgreSQL table: waits for the database as configured, checks the
/// table and its index, takes the metric from the index and trains the router on a
/// sample of the table.
fn pgvector_plan(cfg: &Config) -> Result<StartPlan, StartError> {
    let section = cfg.backend.pgvector.as_ref().ok_or_else(|| {
        StartError::Config(ConfigError::invalid("backend.pgvector", "is not set"))
    })?;
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
    let warm = match &cfg.backend.data_dir {
        Some(dir) if section.changes != ChangesMode::Off => {
            Some(Box::new(pgvector_warm(cfg, section, &target, dir)?))
        }
        _ => None,
    };
    Ok(StartPlan {
        sample,
        metric: Some(target.metric),
        backing: Backing::Pgvector {
            target: Box::new(target),
            warm,
        },
    })
}

/// The cache snapshot of a pgvector backend in `backend.data_dir`: accepted when it was
/// taken of this database's table under this configuration and the slot can replay
/// the changes after it, which are read now (`changes::catch_up`) and replayed before
/// the first reply; refused with a log line otherwise (a cold start).
fn pgvector_warm(
    cfg: &Config,
    section: &PgvectorSection,
    target: &PgTarget,
    dir: &Path,
) -> Result<Warm, StartError> {
    use crate::durable::snapshot;
    let lock = crate::durable::lock_dir(dir)?;
    snapshot::remove_tmp(dir);
    let instance = changes::instance_name(section, Some(dir), cfg.server.listen.port())?;
    let collection = changes::collection_id(target)?;
    let metric = target.metric.to_string();
    let engine = cfg
        .cache
        .engine_config(target.dim)
        .map_err(StartError::Config)?;
    let want = snapshot::Expect {
        collection,
        dim: target.dim,
        metric: &metric,
        shards: cfg.sharding.shard_count(cfg.server.executors),
        settings: crate::durable::fingerprint::settings(&cfg.cache.policy, engine.store_vectors),
        last_seq: u64::MAX,
    };
    let mut state = warm::SnapshotState::new(
        dir.to_path_buf(),
        collection,
        cfg.cache.snapshot_on_shutdown,
        &cfg.cache,
        &engine,
    );
    state.dir_lock = Some(lock);
    let loaded = match cfg.cache.snapshot_load {
        false => Ok(None),
        true => snapshot::load_unlogged(dir, &want),
    };
    let caught_up = loaded.and_then(|s| match s {
        None => Ok(None),
        Some(s) => changes::catch_up(target, section, &instance, s.seq).map(|(tail, to)| {
            Some(WarmStart {
                snapshot: s,
                tail,
                last_seq: to,
            })
        }),
    });
    let start = match caught_up {
        Ok(w) => w,
        Err(why) => {
            state.discard(&why);
            None
        }
    };
    if let Some(w) = &start {
        target.changes.resume_warm(w.last_seq);
    }
    Ok(Warm {
        state: Arc::new(state),
        start,
    })
}

/// The durable embedded store (`backend.data_dir`): recovered from its directory, or,
/// on the first start, the configured data imported into it.
fn durable_plan(cfg: &Config, dir: &Path) -> Result<StartPlan, StartError> {
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
    let warm = warm_start(cfg, dir, rep.imported, r.dim, r.next_seq - 1)?;
    let (store, loaded) = recovered::recovered_store(cfg, dir, &r)?;
    let durable = Durable::open(
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
    let durable = Some(Box::new(DurableStart {
        durable: Arc::new(durable),
        warm,
    }));
    Ok(StartPlan::new(sample, Backing::Embedded { store, durable }))
}

/// The data directory's collection id, and its cache snapshot if one may be used
/// (refused with a log line otherwise: the cache then starts cold).
fn warm_start(
    cfg: &Config,
    dir: &Path,
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
        settings: crate::durable::fingerprint::settings(&cfg.cache.policy, engine.store_vectors),
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
