//! Connection-layer settings (a `[server]` table in the daemon's TOML).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

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
    /// (request id 0) and is closed.
    pub max_connections: usize,
    /// Open connections from one IP address; past it, as past `max_connections`
    /// (0 = no limit).
    pub max_connections_per_source: usize,
    /// With authentication: a connection that has not authenticated this long after it
    /// was accepted is closed (0 = never).
    pub auth_timeout_ms: u64,
    /// Refuse to start on an address other than loopback without authentication
    /// (`[auth]`), and the admin endpoint anywhere but loopback. False: allowed.
    pub protected_mode: bool,
    /// Largest frame (header + body) accepted; a longer one gets TOO_LARGE and the
    /// connection is closed. Also bounds every reply we send.
    pub max_frame_bytes: u32,
    /// Requests one connection may have in the service at once; past it: BUSY. A
    /// SEARCH_BATCH of n queries counts n.
    pub max_inflight: u32,
    /// Queries one SEARCH_BATCH may carry; more: BAD_REQUEST. Above `max_inflight`, that
    /// is the limit ([`ServerConfig::batch_max`]).
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
    pub fn validate(&self) -> Result<(), String> {
        const MIN_FRAME: u32 = FRAME_BYTES_MIN;
        if self.max_frame_bytes < MIN_FRAME {
            return Err(format!(
                "max_frame_bytes = {} is below the minimum {MIN_FRAME}",
                self.max_frame_bytes
            ));
        }
        for (name, v) in [
            ("executors", self.executors as u64),
            ("max_connections", self.max_connections as u64),
            ("max_inflight", self.max_inflight as u64),
            ("max_batch", self.max_batch as u64),
            ("shutdown_poll_ms", self.shutdown_poll_ms),
            ("io_memory_bytes", self.io_memory_bytes as u64),
        ] {
            if v == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        Ok(())
    }

    /// The largest SEARCH_BATCH served: `max_batch`, but never above `max_inflight` (a
    /// batch counts its queries against it, so a larger one could never run).
    pub fn batch_max(&self) -> u32 {
        self.max_batch.min(self.max_inflight)
    }
}
