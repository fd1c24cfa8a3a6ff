//! Connection-layer settings (a `[server]` table in the daemon's TOML). The bounds'
//! keys are spelled `*_max` with the unit before it (`frame_bytes_max`); the old
//! `max_*` names still load (`crate::keys`). The Rust fields keep the old names for now.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// The smallest `max_frame_bytes`: room for a HELLO reply and short error messages.
pub const FRAME_BYTES_MIN: u32 = 256;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Loopback unless configured otherwise.
    pub listen: SocketAddr,
    /// Executors started by `Server::start` (each binds `listen` with SO_REUSEPORT).
    pub executors: usize,
    /// `Server::start` pins executor i to CPU i when true.
    pub pin_cpus: bool,
    /// CPUs to pin executors to, executor i on `cpus[i % len]` (overrides `pin_cpus`);
    /// empty: see `pin_cpus`. For NUMA placement (`ops/NUMA.md`).
    pub cpus: Vec<usize>,
    /// io_uring registered buffer memory per executor. Small: it is locked memory, and
    /// network I/O does not use it.
    pub io_memory_bytes: usize,
    /// Open connections over all executors; past it a connection gets one BUSY reply
    /// (request id 0) and is closed. (`max_connections` before.)
    #[serde(rename = "connections_max", alias = "max_connections")]
    pub max_connections: usize,
    /// Open connections from one IP address; past it, as past `connections_max`
    /// (0 = no limit). (`max_connections_per_source` before.)
    #[serde(
        rename = "connections_per_source_max",
        alias = "max_connections_per_source"
    )]
    pub max_connections_per_source: usize,
    /// With authentication: a connection that has not authenticated this long after it
    /// was accepted is closed (0 = never).
    pub auth_timeout_ms: u64,
    /// Refuse to start on an address other than loopback without authentication
    /// (`[auth]`), and the admin endpoint anywhere but loopback. False: allowed.
    pub protected_mode: bool,
    /// Largest frame (header + body) accepted; a longer one gets TOO_LARGE and the
    /// connection is closed. Also bounds every reply we send. (`max_frame_bytes` before.)
    #[serde(rename = "frame_bytes_max", alias = "max_frame_bytes")]
    pub max_frame_bytes: u32,
    /// Requests one connection may have in the service at once; past it: BUSY. A
    /// SEARCH_BATCH of n queries counts n. (`max_inflight` before.)
    #[serde(rename = "inflight_max", alias = "max_inflight")]
    pub max_inflight: u32,
    /// Queries one SEARCH_BATCH may carry; more: BAD_REQUEST. Above `inflight_max`, that
    /// is the limit ([`ServerConfig::batch_max`]). (`max_batch` before.)
    #[serde(rename = "batch_max", alias = "max_batch")]
    pub max_batch: u32,
    /// Upper bound on every request's time in the service (0 = none); a SEARCH may ask
    /// for less with its own deadline.
    pub request_timeout_ms: u64,
    /// A connection with nothing in flight that sends nothing for this long is closed
    /// (0 = never).
    pub idle_timeout_ms: u64,
    /// A peer that does not read its replies for this long is disconnected (0 = never).
    pub write_timeout_ms: u64,
    /// Encoded replies waiting for the socket past which a connection stops reading
    /// requests (back-pressure on clients that do not read).
    pub output_high_water_bytes: usize,
    /// How often each executor checks the shutdown flag.
    pub shutdown_poll_ms: u64,
    /// How long shutdown waits for in-flight requests before dropping connections.
    pub shutdown_grace_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7700)),
            executors: 1,
            pin_cpus: false,
            cpus: Vec::new(),
            io_memory_bytes: 1 << 20,
            max_connections: 1024,
            max_connections_per_source: 256,
            protected_mode: true,
            auth_timeout_ms: 10_000,
            max_frame_bytes: 4 << 20,
            max_inflight: 256,
            max_batch: 256,
            request_timeout_ms: 5_000,
            idle_timeout_ms: 300_000,
            write_timeout_ms: 10_000,
            output_high_water_bytes: 1 << 20,
            shutdown_poll_ms: 50,
            shutdown_grace_ms: 5_000,
        }
    }
}

impl ServerConfig {
    /// Refuses settings the connection layer cannot honour.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_frame_bytes < FRAME_BYTES_MIN {
            return Err(ConfigError::invalid(
                "server.frame_bytes_max",
                format!(
                    "{} is below the minimum {FRAME_BYTES_MIN}",
                    self.max_frame_bytes
                ),
            ));
        }
        for (key, v) in [
            ("executors", self.executors as u64),
            ("connections_max", self.max_connections as u64),
            ("inflight_max", self.max_inflight as u64),
            ("batch_max", self.max_batch as u64),
            ("shutdown_poll_ms", self.shutdown_poll_ms),
            ("io_memory_bytes", self.io_memory_bytes as u64),
        ] {
            if v == 0 {
                return Err(ConfigError::invalid(
                    format!("server.{key}"),
                    "must be at least 1",
                ));
            }
        }
        Ok(())
    }

    /// The largest SEARCH_BATCH served: `batch_max`, but never above `inflight_max` (a
    /// batch counts its queries against it, so a larger one could never run).
    pub fn batch_max(&self) -> u32 {
        self.max_batch.min(self.max_inflight)
    }
}
