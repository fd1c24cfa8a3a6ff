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
//!  admin thread(s): GET /metrics ─► Snapshot (engine counters, owner gauges, histograms,
//!                  the server's counters): the same one STATS renders (snapshot.rs)
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
//!
//! Where things are: what to serve is a [`StartPlan`] (`plan.rs`, from the config or a
//! test's own store); `start.rs` starts one, step by step; `shared.rs` is what the
//! executors share; `snapshot.rs` takes the samples STATS and `/metrics` render.

mod admin;
mod backend;
mod data;
mod error;
mod handler;
mod owner;
pub mod pgvector;
mod plan;
mod recall;
mod recovered;
mod shared;
mod snapshot;
mod start;
mod warm;

pub(crate) use admin::AdminServer;
pub use backend::Store;
pub use data::Dataset;
pub use error::StartError;
pub use plan::StartPlan;

/// `akerd --drop-slot`: removes this akerd's change-stream slot and publication from the
/// database (an operator retiring it: a slot left behind holds WAL). What was dropped.
/// The pgvector url as the driver (tokio-postgres) is to parse it: libpq's `sslmode`
/// values and `sslrootcert` taken out (`pgvector/tls.rs`). For config checks.
pub fn pgvector_url(url: &str) -> Result<String, String> {
    pgvector::tls::split_url(url).map(|s| s.url)
}

/// `akerd --cluster-retrain`: new centroids for the cluster, published as its next
/// version (`crate::cluster`). What was published.
pub fn cluster_retrain(cfg: &crate::config::Config) -> Result<String, StartError> {
    crate::cluster::start::retrain(cfg)
}

pub fn drop_change_slot(cfg: &crate::config::Config) -> Result<String, StartError> {
    let section = cfg.backend.pgvector.as_ref().ok_or_else(|| {
        StartError::Config(crate::config::ConfigError::invalid(
            "backend.pgvector",
            "--drop-slot is for kind = \"pgvector\"",
        ))
    })?;
    let instance = pgvector::changes::instance_name(
        section,
        cfg.backend.data_dir.as_deref(),
        cfg.server.listen.port(),
    )?;
    pgvector::changes::drop_slot(section, &instance)
}

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::metrics::Snapshot;
use crate::server::{Running, Server};
pub(crate) use shared::Shared;

/// A running daemon: executors, backend threads and the admin endpoint. Started from a
/// [`StartPlan`] (`start.rs`).
pub struct Daemon {
    running: Option<Running>,
    admin: Option<AdminServer>,
    backend_threads: Vec<JoinHandle<()>>,
    backend_stop: Arc<AtomicBool>,
    /// Writes a snapshot every `cache.snapshot_interval_s` (stops with `backend_stop`).
    snapshot_timer: Option<JoinHandle<()>>,
    /// `[cluster]`: the lease thread and its own stop flag (it leaves first at a stop).
    lease: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
    shared: Arc<Shared>,
}

impl Daemon {
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

    /// What STATS and `/metrics` show, the connection layer's counters included.
    pub(crate) fn snapshot(&self) -> Snapshot {
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
        // Leave the cluster first: the other nodes take this node's centroids at their
        // next renewal while it still answers what reaches it (bounded: the lease
        // thread's database calls are).
        if let Some((stop, t)) = self.lease.take() {
            stop.store(true, Ordering::Release);
            let _ = t.join();
        }
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
