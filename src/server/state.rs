//! What the executors and their connections share: the [`Server`] handle (config,
//! counters, shutdown flag) and one executor's [`ExecutorCtx`]. A leaf: the accept loop
//! (`listener.rs`) and the connection tasks (`conn.rs`) both build on it.

use std::cell::Cell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::stats::ServerStats;
use super::sync::Latch;
use super::tls::{HandshakeTokens, TlsAcceptor};
use super::{ServerConfig, Service};
use crate::auth::Secret;
use crate::config::ConfigError;
use crate::protocol::{HelloReply, Limits};

struct Inner {
    config: ServerConfig,
    stats: Arc<ServerStats>,
    shutdown: AtomicBool,
    /// Set: every connection authenticates before anything but HELLO, PING and AUTH.
    secret: Option<Secret>,
    /// Set: the client port speaks TLS only.
    tls: Option<Arc<TlsAcceptor>>,
    /// Open connections per source address, for `max_connections_per_source`. Touched
    /// at accept and close only (the control plane), never per request.
    per_source: Mutex<HashMap<IpAddr, usize>>,
}

/// The part of a server that all executors share: configuration, counters, the
/// connection gate and the shutdown flag. Cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

impl Server {
    /// A server without authentication.
    pub fn new(config: ServerConfig) -> Result<Server, ConfigError> {
        Server::with_auth(config, None)
    }

    /// A server whose connections authenticate with `secret` (protocol version 3).
    pub fn with_auth(config: ServerConfig, secret: Option<Secret>) -> Result<Server, ConfigError> {
        Server::with_security(config, secret, None)
    }

    /// A server whose connections authenticate with `secret`, over TLS with `tls`.
    /// Protected mode: beyond loopback, a secret or mutual TLS says who may come in (TLS
    /// alone only hides what is said).
    pub fn with_security(
        config: ServerConfig,
        secret: Option<Secret>,
        tls: Option<Arc<TlsAcceptor>>,
    ) -> Result<Server, ConfigError> {
        config.validate()?;
        let ip = config.listen.ip().to_canonical();
        let mutual_tls = tls
            .as_ref()
            .is_some_and(|t| t.requires_client_certificates());
        if config.protected_mode && secret.is_none() && !mutual_tls && !ip.is_loopback() {
            return Err(ConfigError::ProtectedMode(format!(
                "refusing to listen on {ip} without authentication (a secret, or TLS with \
                 tls.client_ca_file)"
            )));
        }
        Ok(Server {
            inner: Arc::new(Inner {
                config,
                stats: Arc::new(ServerStats::default()),
                shutdown: AtomicBool::new(false),
                secret,
                tls,
                per_source: Mutex::new(HashMap::new()),
            }),
        })
    }

    pub(crate) fn secret(&self) -> Option<&Secret> {
        self.inner.secret.as_ref()
    }

    /// With `[tls]`: the acceptor (its `reload` takes new certificate files).
    pub fn tls(&self) -> Option<&Arc<TlsAcceptor>> {
        self.inner.tls.as_ref()
    }

    /// Counts a connection from `ip` in; false (and nothing counted) when its source
    /// ([`source_of`]) already has `max_connections_per_source` open.
    pub(crate) fn source_enter(&self, ip: IpAddr) -> bool {
        let max = self.config().max_connections_per_source;
        if max == 0 {
            return true;
        }
        let mut m = self
            .inner
            .per_source
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let n = m.entry(source_of(ip)).or_insert(0);
        if *n >= max {
            return false;
        }
        *n += 1;
        true
    }

    /// Counts a connection from `ip` out (after `source_enter` said true).
    pub(crate) fn source_leave(&self, ip: IpAddr) {
        if self.config().max_connections_per_source == 0 {
            return;
        }
        let mut m = self
            .inner
            .per_source
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = source_of(ip);
        if let Some(n) = m.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&key);
            }
        }
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

/// What one source is for `max_connections_per_source`: an IPv4 address (an IPv4-mapped
/// IPv6 one counts as it), or an IPv6 /64, which one host is usually given whole.
pub(crate) fn source_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
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
    /// With `[tls]`: this executor's handshake rate bound.
    pub(super) handshakes: HandshakeTokens,
}
