//! Connection-layer counters, shared by all executors (relaxed atomics: they are counts,
//! nothing is ordered by them). STATS replies carry them after the service's own lines.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct ServerStats {
    /// Open connections (also the `max_connections` gate).
    pub connections_current: AtomicU64,
    pub connections_accepted: AtomicU64,
    /// Refused past `max_connections`.
    pub connections_rejected: AtomicU64,
    pub requests: AtomicU64,
    pub replies: AtomicU64,
    /// BUSY past `max_inflight`.
    pub busy_inflight: AtomicU64,
    /// Frames that lost framing (BAD_FRAME, TOO_LARGE): connection closed.
    pub framing_errors: AtomicU64,
    /// Bad frames answered with an error, connection kept.
    pub frame_errors: AtomicU64,
    /// Refused by validation (dimension, finiteness, k).
    pub invalid_requests: AtomicU64,
    pub deadline_exceeded: AtomicU64,
    /// Service panics, wrong reply kinds, unencodable or oversized replies.
    pub internal_errors: AtomicU64,
    /// Times a reader stopped reading because its peer was not reading its replies.
    pub output_stalls: AtomicU64,
}

impl ServerStats {
    pub(crate) fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// `name value` lines, prefixed `server_`.
    pub fn render(&self, out: &mut String) {
        let rows = [
            ("connections_current", &self.connections_current),
            ("connections_accepted", &self.connections_accepted),
            ("connections_rejected", &self.connections_rejected),
            ("requests", &self.requests),
            ("replies", &self.replies),
            ("busy_inflight", &self.busy_inflight),
            ("framing_errors", &self.framing_errors),
            ("frame_errors", &self.frame_errors),
            ("invalid_requests", &self.invalid_requests),
            ("deadline_exceeded", &self.deadline_exceeded),
            ("internal_errors", &self.internal_errors),
            ("output_stalls", &self.output_stalls),
        ];
        for (name, v) in rows {
            let _ = writeln!(out, "server_{name} {}", v.load(Ordering::Relaxed));
        }
    }
}
