//! aker: a cache server that answers nearest-neighbour searches from an approximate
//! result cache (see `docs/ARCHITECTURE.md`).
//!
//! - [`protocol`]: the versioned binary wire protocol (`PROTOCOL.md`): parse / compose /
//!   validate, pure functions over byte buffers.
//! - [`client`]: blocking and pipelined clients over `std::net::TcpStream`.
//! - [`server`]: the glommio connection layer, independent of the cache: it speaks the
//!   protocol and hands validated requests to a [`server::Service`].
//! - [`service`]: the daemon (`akerd`): the engine behind the connection layer across
//!   executors, backend threads, the admin endpoint.
//! - [`auth`]: the shared secret and the challenge-response of protocol version 3.
//! - [`config`]: the daemon's TOML file; [`demo`]: `akerd --demo`.
//! - [`cli`]: `aker-cli`, the operator's command line (ping, stats, search, flush, watch).
//! - [`cluster`]: a tier of nodes coordinated through PostgreSQL: who owns which
//!   centroid (what [`client::Cluster`] routes by) and the node's side of it.
//!
//! That is the API. The rest is `pub(crate)`: `durable` (the embedded store's log,
//! checkpoints and the cache snapshot), `metrics` (histograms, STATS and Prometheus), the
//! service's parts. `testing` (hidden) is not API: what the repository's own tests and
//! benches reach inside for.

// `unreachable_pub` keeps the surface honest: a `pub` no user can reach warns, and CI's
// clippy denies warnings.
#![warn(unreachable_pub)]

pub mod auth;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod config;
pub mod demo;
mod durable;
mod metrics;
pub mod protocol;
pub mod server;
pub mod service;

/// Not API: what the repository's own integration tests and benches reach inside the
/// daemon for (no stability promise; hidden from the docs).
#[doc(hidden)]
pub mod testing {
    /// The pgvector backend's start-time discovery and its connection
    /// (`tests/pgvector.rs`, `bench/benches/pgvector_search.rs`).
    pub mod pgvector {
        pub use crate::service::pgvector::conn::{PgAnswer, PgConn};
        pub use crate::service::pgvector::discover::{search_plan, start};
        pub use crate::service::pgvector::PgTarget;
    }
}
