//! Connection-layer counters, shared by all executors (relaxed atomics: they are counts,
//! nothing is ordered by them). STATS replies carry them after the service's own lines.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::metrics::Sample;

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
    /// Refused by validation (dimension, finiteness, k); a SEARCH_BATCH query that is not
    /// finite counts one (its item is NON_FINITE).
    pub invalid_requests: AtomicU64,
    pub deadline_exceeded: AtomicU64,
    /// Service panics, wrong reply kinds, unencodable or oversized replies.
    pub internal_errors: AtomicU64,
    /// Times a reader stopped reading because its peer was not reading its replies.
    pub output_stalls: AtomicU64,
    /// Refused past `max_connections_per_source`.
    pub connections_rejected_per_source: AtomicU64,
    /// Requests refused before their connection authenticated.
    pub unauthenticated_requests: AtomicU64,
    /// AUTH requests whose proof did not hold (each closed its connection).
    pub auth_failures: AtomicU64,
    /// SEARCH_BATCH frames handed to the service, and the queries they carried.
    pub batches: AtomicU64,
    pub batch_queries: AtomicU64,
    /// With `[tls]`: handshakes completed, failed (bad certificate, protocol error, the
    /// peer gone), not done within the handshake timeout (or no handshake slot within
    /// it), and plaintext clients told the port requires TLS.
    pub tls_handshakes: AtomicU64,
    pub tls_handshake_failures: AtomicU64,
    pub tls_handshake_timeouts: AtomicU64,
    pub tls_plaintext_refused: AtomicU64,
}

type Row = (&'static str, &'static str, fn(&ServerStats) -> &AtomicU64);

/// Every counter but the one gauge, `server_connections_current`.
const COUNTERS: [Row; 20] = [
    (
        "server_connections_accepted",
        "Connections accepted.",
        |s| &s.connections_accepted,
    ),
    (
        "server_connections_rejected",
        "Connections refused past server.connections_max.",
        |s| &s.connections_rejected,
    ),
    ("server_requests", "Request frames decoded.", |s| {
        &s.requests
    }),
    ("server_replies", "Replies encoded.", |s| &s.replies),
    (
        "server_busy_inflight",
        "Requests refused with BUSY past server.inflight_max.",
        |s| &s.busy_inflight,
    ),
    (
        "server_framing_errors",
        "Frames that lost framing (BAD_FRAME, TOO_LARGE); the connection was closed.",
        |s| &s.framing_errors,
    ),
    (
        "server_frame_errors",
        "Bad frames answered with an error; the connection was kept.",
        |s| &s.frame_errors,
    ),
    (
        "server_invalid_requests",
        "Requests refused by validation (dimension, finiteness, k); a SEARCH_BATCH query with a non-finite component counts one.",
        |s| &s.invalid_requests,
    ),
    (
        "server_deadline_exceeded",
        "Requests answered DEADLINE_EXCEEDED.",
        |s| &s.deadline_exceeded,
    ),
    (
        "server_internal_errors",
        "Service panics, wrong reply kinds, unencodable or oversized replies.",
        |s| &s.internal_errors,
    ),
    (
        "server_output_stalls",
        "Times a reader stopped reading because its peer was not reading its replies.",
        |s| &s.output_stalls,
    ),
    (
        "server_connections_rejected_per_source",
        "Connections refused past server.connections_per_source_max.",
        |s| &s.connections_rejected_per_source,
    ),
    (
        "server_unauthenticated_requests",
        "Requests refused because their connection had not authenticated.",
        |s| &s.unauthenticated_requests,
    ),
    (
        "server_auth_failures",
        "AUTH requests whose proof did not hold; each closed its connection.",
        |s| &s.auth_failures,
    ),
    (
        "server_batches",
        "SEARCH_BATCH frames served (each query also counts as a search).",
        |s| &s.batches,
    ),
    (
        "server_batch_queries",
        "Queries carried by the SEARCH_BATCH frames served.",
        |s| &s.batch_queries,
    ),
    ("server_tls_handshakes", "TLS handshakes completed.", |s| {
        &s.tls_handshakes
    }),
    (
        "server_tls_handshake_failures",
        "TLS handshakes that failed (certificate refused, protocol error, peer gone).",
        |s| &s.tls_handshake_failures,
    ),
    (
        "server_tls_handshake_timeouts",
        "Connections closed without a TLS handshake within tls.handshake_timeout_ms (waiting for a handshake slot included).",
        |s| &s.tls_handshake_timeouts,
    ),
    (
        "server_tls_plaintext_refused",
        "Plaintext clients on the TLS port, told so in one plaintext error frame and closed.",
        |s| &s.tls_plaintext_refused,
    ),
];

impl ServerStats {
    pub(crate) fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// The counters as samples, named `server_...`.
    pub(crate) fn samples(&self) -> Vec<Sample> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let current = Sample::gauge(
            "server_connections_current",
            "Open connections.",
            get(&self.connections_current) as f64,
        );
        let counters = COUNTERS
            .iter()
            .map(|&(name, help, c)| Sample::counter(name, help, get(c(self))));
        std::iter::once(current).chain(counters).collect()
    }
}
