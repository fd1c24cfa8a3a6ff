//! What the executors and their connections share: the [`Server`] handle (config,
//! counters, shutdown flag) and one executor's [`ExecutorCtx`]. A leaf: the accept loop
//! (`listener.rs`) and the connection tasks (`conn.rs`) both build on it.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::stats::ServerStats;
use super::sync::Latch;
use super::{ServerConfig, Service};
use crate::protocol::{HelloReply, Limits};

struct Inner {
    config: ServerConfig,
    stats: Arc<ServerStats>,
    shutdown: AtomicBool,
}

/// The part of a server that all executors share: configuration, counters, the
/// connection gate and the shutdown flag. Cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

impl Server {
    pub fn new(config: ServerConfig) -> Result<Server, String> {
        config.validate()?;
        Ok(Server {
            inner: Arc::new(Inner {
                config,
                stats: Arc::new(ServerStats::default()),
                shutdown: AtomicBool::new(false),
            }),
        })
    }

    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    pub fn stats(&self) -> &ServerStats {
        &self.inner.stats
    }

    pub(crate) fn stats_arc(&self) -> Arc<ServerStats> {
        self.inner.stats.clone()
    }

    /// Asks every executor to stop: each stops accepting within `shutdown_poll_ms`, lets
    /// in-flight requests answer (at most `shutdown_grace_ms`), sends SHUTTING_DOWN and
    /// closes its connections, and `serve` returns.
    pub fn shutdown(&self) {
        self.inner.shutdown.store(true, Ordering::Release);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutdown.load(Ordering::Acquire)
    }
}

/// Per-executor state every connection task shares.
pub(crate) struct ExecutorCtx {
    pub(crate) server: Server,
    pub(crate) service: Rc<dyn Service>,
    pub(crate) limits: Limits,
    pub(crate) hello: HelloReply,
    /// Set when the executor shuts down; every reader races its reads against it.
    pub(crate) shutdown: Latch,
    /// Open connections and connections being turned away, on this executor.
    pub(super) live: Cell<usize>,
    pub(super) rejecting: Cell<usize>,
}
