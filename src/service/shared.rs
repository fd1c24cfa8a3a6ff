//! What every executor, the admin endpoint and the snapshot timer share: the router,
//! every shard's handle and gauges, the backend queue, the metrics and the connection
//! layer's counters. Built once at start (`start.rs`), then only read (atomics inside).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use shards::budget::GlobalBudget;
use shards::owner::ShardHandle;
use shards::router::Router;
use shards::CacheConfig;

use super::backend::BackendPool;
use super::owner::ShardGauges;
use super::{recall, warm};
use crate::metrics::ExecutorMetrics;
use crate::server::{ServerStats, ServiceInfo};

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
    /// The connection layer's counters, handed over at start: STATS and /metrics take
    /// them with the service's own samples (`snapshot.rs`).
    pub(crate) server_stats: Arc<ServerStats>,
    /// The recall floor (`recall.rs`): `None` when it is off or unavailable.
    pub(crate) recall: Option<Arc<recall::RecallChecks>>,
    /// A floor was asked for where there is no backend to check against (cache-aside).
    pub(crate) recall_unavailable: bool,
    /// The durable store's log and checkpoints (`backend.data_dir`), for its metrics.
    pub(crate) durable: Option<Arc<crate::durable::Durable>>,
    /// The cache's warm-restart snapshot (`warm.rs`): with the durable store only.
    pub(crate) snapshots: Option<Arc<warm::SnapshotState>>,
    /// This node's side of a cluster (`crate::cluster`): `None` when not in one.
    pub(crate) cluster: Option<Arc<crate::cluster::ClusterState>>,
}
