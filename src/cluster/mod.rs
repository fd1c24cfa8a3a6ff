//! A tier of akerd nodes in front of one PostgreSQL table, coordinated through
//! PostgreSQL itself (`docs/CLUSTER.md`): no consensus of ours, no node everything
//! depends on.
//!
//! ```text
//!  PostgreSQL (schema cluster.schema)          every node (thread "aker-cluster")
//!  ┌──────────────────────────────┐   join     ┌───────────────────────────────────┐
//!  │ routing(cluster, version,    │◄──────────►│ first node: trains the centroids, │
//!  │   centroids, fingerprint)    │ (advisory  │ publishes version 1; the others   │
//!  │ nodes(cluster, node_id,      │  xact lock)│ load it (local router built on    │
//!  │   advertise, lease_until,    │            │ the same centroids)               │
//!  │   load, slot)                │   renew    │ every renew_ms: lease_until =     │
//!  │ balance(cluster, epoch,      │◄──────────►│ now() + lease_ms, publish load,   │
//!  │   overrides)                 │ one round  │ read members, routing version,    │
//!  └──────────────────────────────┘   trip     │ overrides ─► ClusterState          │
//!                                              │ lowest live id: balance by load,  │
//!                                              │ drop slots of nodes long gone     │
//!                                              └───────────────────────────────────┘
//!  client (aker::client::Cluster, aker.Cluster): CLUSTER (v6) from any node ─► nearest
//!  centroid of each query ─► owner (override if live, else rendezvous over live nodes)
//!  ─► that node; a SEARCH reply's routing version newer than the client's: fetch again
//! ```
//!
//! Ownership is a pure function of (live node ids, overrides, centroid): every node and
//! client computes it alone ([`owner_order`]). Routing is for locality only: every node
//! answers every query correctly (same table), and counts the searches it does not own.
//!
//! ```text
//!  cluster/
//!    mod.rs      ownership (rendezvous + overrides), the state executors read
//!    schema.rs   the tables, joining (publish or load the centroids), the statements
//!    member.rs   the lease thread: renew, read the membership, balance, drop slots
//!    balance.rs  load-aware overrides (pure)
//!    start.rs    joining at start: node id, centroids, the local router, the thread
//! ```

pub(crate) mod balance;
pub(crate) mod member;
pub(crate) mod schema;
pub(crate) mod start;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::protocol::{ClusterNode, ClusterReply};
use shards::counter::Counter;
use shards::epoch::EpochCell;

/// splitmix64's finaliser: a bijection that spreads every input bit over the output.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Node `node_id`'s rendezvous score for `centroid`: the highest live score owns it
/// (ties: the larger id). PROTOCOL.md "Clusters" spells it out for other clients.
pub fn rendezvous_score(node_id: u64, centroid: u32) -> u64 {
    mix64(node_id ^ mix64(centroid as u64))
}

/// How nodes rank for `centroid`, highest first: by rendezvous score, ties to the larger
/// id. The one ordering routing (`owner_order`) and balancing (`balance.rs`) use.
pub(crate) fn rendezvous_rank(node_id: u64, centroid: u32) -> std::cmp::Reverse<(u64, u64)> {
    std::cmp::Reverse((rendezvous_score(node_id, centroid), node_id))
}

/// The nodes to send a query of `centroid` to, in order: its override when live, then
/// live nodes by descending rendezvous score, then the nodes not live (a lease can lapse
/// while the node still answers).
pub fn owner_order(state: &ClusterReply, centroid: u32) -> Vec<u64> {
    let mut live: Vec<&ClusterNode> = state.nodes.iter().filter(|n| n.live).collect();
    let by_rank = |n: &&ClusterNode| rendezvous_rank(n.node_id, centroid);
    live.sort_by_key(by_rank);
    let mut order: Vec<u64> = Vec::with_capacity(state.nodes.len());
    if let Some(&(_, n)) = state.overrides.iter().find(|(c, _)| *c == centroid) {
        if live.iter().any(|l| l.node_id == n) {
            order.push(n);
        }
    }
    for n in live {
        if !order.contains(&n.node_id) {
            order.push(n.node_id);
        }
    }
    let mut gone: Vec<&ClusterNode> = state.nodes.iter().filter(|n| !n.live).collect();
    gone.sort_by_key(by_rank);
    order.extend(gone.iter().map(|n| n.node_id));
    order
}

/// The owner of `centroid` (`None` with no node at all).
pub fn owner(state: &ClusterReply, centroid: u32) -> Option<u64> {
    owner_order(state, centroid).first().copied()
}

/// The nearest centroid to `q` by the cluster's routing metric (the router's: by angle
/// for `ip` and `cosine`, squared L2 otherwise).
pub fn nearest_centroid(state: &ClusterReply, q: &[f32]) -> u32 {
    shards::router::nearest_centroid(&state.centroids, q.len(), state.metric, q) as u32
}

/// What a node of a cluster shares with its executors: the current view, which of the
/// centroids it owns, the searches each centroid drew, its counters.
pub(crate) struct ClusterState {
    pub(crate) name: String,
    pub(crate) self_id: u64,
    /// Swapped whole by the lease thread; read lock-free by searches (`observe`).
    view: EpochCell<Arc<ClusterReply>>,
    routing_version: AtomicU64,
    centroids_version: AtomicU64,
    /// Per centroid of the view: owned by this node.
    owned: Vec<AtomicBool>,
    /// Per centroid of the view: searches whose nearest centroid it is (what this node
    /// publishes as its load, whatever its shards' router was built on).
    loads: Vec<Counter>,
    /// The local router was built on the view's centroids (same index space): a
    /// search's nearest centroid there is the cluster's.
    local_matches: AtomicBool,
    pub(crate) foreign_searches: Counter,
    pub(crate) renewals: AtomicU64,
    pub(crate) renew_failures: AtomicU64,
    pub(crate) owned_load_per_s: AtomicU64,
    pub(crate) live_nodes: AtomicU64,
    pub(crate) slots_dropped: AtomicU64,
    pub(crate) balance_publications: AtomicU64,
}

fn centroid_count(view: &ClusterReply) -> usize {
    view.centroids.len() / view.dim.max(1) as usize
}

impl ClusterState {
    pub(crate) fn new(view: ClusterReply, local_matches: bool) -> ClusterState {
        let n = centroid_count(&view);
        let s = ClusterState {
            name: view.name.clone(),
            self_id: view.self_id,
            routing_version: AtomicU64::new(view.routing_version),
            centroids_version: AtomicU64::new(view.centroids_version),
            owned: (0..n).map(|_| AtomicBool::new(false)).collect(),
            loads: (0..n).map(|_| Counter::default()).collect(),
            local_matches: AtomicBool::new(local_matches),
            view: EpochCell::new(Arc::new(view.clone())),
            foreign_searches: Counter::default(),
            renewals: AtomicU64::new(0),
            renew_failures: AtomicU64::new(0),
            owned_load_per_s: AtomicU64::new(0),
            live_nodes: AtomicU64::new(0),
            slots_dropped: AtomicU64::new(0),
            balance_publications: AtomicU64::new(0),
        };
        s.publish(view);
        s
    }

    pub(crate) fn view(&self) -> Arc<ClusterReply> {
        self.view.read(Arc::clone)
    }

    pub(crate) fn routing_version(&self) -> u64 {
        self.routing_version.load(Ordering::Relaxed)
    }

    pub(crate) fn centroids_version(&self) -> u64 {
        self.centroids_version.load(Ordering::Relaxed)
    }

    /// Installs a new view (the lease thread, after each renewal).
    pub(crate) fn publish(&self, view: ClusterReply) {
        let old = self
            .centroids_version
            .swap(view.centroids_version, Ordering::Relaxed);
        if view.centroids_version != old {
            // A retrain: the local router keeps its centroids (its shards were built on
            // them); searches find the cluster's nearest centroid on the view.
            self.local_matches.store(false, Ordering::Relaxed);
        }
        let same_shape = centroid_count(&view) == self.owned.len();
        for c in 0..self.owned.len() {
            let mine = same_shape && owner(&view, c as u32) == Some(self.self_id);
            self.owned[c].store(mine, Ordering::Relaxed);
        }
        let live = view.nodes.iter().filter(|n| n.live).count() as u64;
        self.live_nodes.store(live, Ordering::Relaxed);
        self.routing_version
            .store(view.routing_version, Ordering::Relaxed);
        self.view.store(Arc::new(view));
    }

    pub(crate) fn local_matches(&self) -> bool {
        self.local_matches.load(Ordering::Relaxed)
    }

    pub(crate) fn owns(&self, centroid: usize) -> bool {
        self.owned
            .get(centroid)
            .is_some_and(|o| o.load(Ordering::Relaxed))
    }

    pub(crate) fn owned_centroids(&self) -> u64 {
        self.owned
            .iter()
            .filter(|o| o.load(Ordering::Relaxed))
            .count() as u64
    }

    /// Searches per centroid since start (running totals; empty after a retrain that
    /// changed the centroid count: such a node publishes no load until it restarts).
    pub(crate) fn centroid_loads(&self) -> Vec<u64> {
        let same = self.view.read(|v| centroid_count(v) == self.loads.len());
        if same {
            self.loads.iter().map(Counter::get).collect()
        } else {
            Vec::new()
        }
    }

    /// A search whose nearest centroid in the local router is `local_centroid`: its
    /// load counted, and counted as foreign when another node owns it. After a retrain
    /// (the local router's centroids are not the view's) the nearest is found here, on
    /// the view, lock-free.
    pub(crate) fn observe(&self, local_centroid: usize, q: &[f32]) {
        let c = if self.local_matches() {
            local_centroid
        } else {
            self.view.read(|v| nearest_centroid(v, q) as usize)
        };
        if let Some(l) = self.loads.get(c) {
            l.bump();
        }
        if !self.owns(c) {
            self.foreign_searches.bump();
        }
    }
}

#[cfg(test)]
mod tests;
