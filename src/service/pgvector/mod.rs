//! The pgvector backend: a PostgreSQL table with a `vector` column and its HNSW index.
//!
//! ```text
//!  start:  connect (retry with backoff up to start_wait_ms) ─► discover:
//!          pgvector >= 0.8, table, NOT NULL bigint id with a unique index, vector(n)
//!          column, the HNSW index's operator class ─► metric, EXPLAIN of the search
//!          (warns if it does not use the index), TABLESAMPLE of the vectors ─►
//!          routing centroids; every statement bounded (statement_timeout)
//!  run:    backend thread i ── its own connection (PgConn) on a current-thread runtime
//!          search: BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL ef_search,
//!                  iterative_scan, statement_timeout
//!                  │ prepared SELECT id, dist [, vector] ORDER BY dist LIMIT <k + Δ>
//!                  │ COMMIT                      ── pipelined: one round trip
//!          write:  the same around a prepared INSERT ... ON CONFLICT / DELETE
//!          connection lost ─► fail fast (UNAVAILABLE), reconnect with backoff
//! ```
//!
//! Settings are `SET LOCAL` inside each statement's own transaction so that they hold
//! behind a transaction-mode pooler, where consecutive transactions may run on
//! different server sessions (the statements are prepared, which PgBouncer supports in
//! transaction mode from 1.21 on, with `max_prepared_statements` above 0; a statement
//! the server no longer knows is prepared again). The request's deadline becomes the
//! statement's `statement_timeout`: a slow database cannot hold every connection past it.
//!
//! Distances come back in the cache's units: `<->` is plain L2 (squared here), `<#>` is
//! the negative inner product (the engine's `-dot`), `<=>` is `1 - cos`.
//!
//! ```text
//!  pgvector/
//!    mod.rs       what start-up found (PgTarget), its statements' text, the counters
//!    discover.rs  start: connect, check the table / index / metric / dimension, sample
//!    conn.rs      one backend thread's connection (PgConn): pipelined statements
//!    in_doubt.rs  writes whose commit is unknown: sessions, settling, stripping
//!    side.rs      the backend pool's pgvector side (searches and writes of a thread)
//!    sql.rs       the SQL vocabulary shared with aker-loadgen
//!    changes/     the change stream: the table's committed changes, applied in commit
//!                 order (its own thread and connections)
//!    pgoutput.rs  the decoder of the stream's messages
//!    replica.rs   misses to read replicas (`replica_urls`), once they have replayed
//!                 what the cache holds
//! ```
//!
//! Whatever else talks to the database grows as a file beside these.

pub(crate) mod changes;
pub(crate) mod conn;
pub(crate) mod discover;
mod in_doubt;
pub(crate) mod pgoutput;
pub(crate) mod replica;
mod side;
pub mod sql;
pub(crate) mod tls;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use shards::Metric;
use tokio_postgres::{Client, NoTls};

pub(crate) use conn::PgConn;
pub(crate) use discover::start;
pub(crate) use side::PgSide;

/// First pause between connection attempts; doubles up to the configured maximum.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
/// How long a statement may overrun its own `statement_timeout` (network, the server
/// noticing the timeout) before the client gives up on the connection.
const CLIENT_GRACE: Duration = Duration::from_millis(1000);

/// What start-up found, shared by every backend thread.
pub struct PgTarget {
    pub dim: usize,
    pub metric: Metric,
    /// The HNSW index the searches use.
    pub index: String,
    /// The table as PostgreSQL prints it (schema-qualified where needed, quoted).
    pub table: String,
    pub(crate) conn: PgConnect,
    sql: Sql,
    /// `BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL ...` of a search, before its
    /// `statement_timeout`.
    search_prelude: String,
    statement_timeout: Duration,
    reconnect_max: Duration,
    with_vectors: bool,
    has_payload: bool,
    pub(crate) stats: PgStats,
    /// The change stream's applied position and counters (`changes/`).
    pub(crate) changes: changes::ChangeFeed,
    /// The read replicas misses may go to (`replica.rs`; none unless `replica_urls`).
    pub(crate) replicas: replica::Replicas,
}

/// The text of the statements every connection prepares.
struct Sql {
    /// The search without its `LIMIT` value: each limit is prepared as its own statement
    /// with the number in the text, so that a generic plan (PostgreSQL switches to one
    /// after five executions) still knows how few rows are wanted and keeps the index.
    search_prefix: String,
    insert: String,
    delete: String,
}

impl Sql {
    fn search(&self, n: usize) -> String {
        format!("{}{n}", self.search_prefix)
    }
}

/// Counters of the connection pool, for STATS and /metrics.
#[derive(Default)]
pub(crate) struct PgStats {
    /// Backend threads holding a live connection.
    pub connections_up: AtomicU64,
    /// Connections opened after a lost one (not the first of each thread).
    pub reconnects: AtomicU64,
    pub connect_failures: AtomicU64,
    /// Statements cancelled at their deadline (`statement_timeout`).
    pub statement_timeouts: AtomicU64,
    /// Rows left out of answers: a negative id (the protocol's ids are u64), or no
    /// finite distance (a NULL or zero vector under cosine).
    pub rows_skipped: AtomicU64,
    /// Writes whose outcome was in doubt (connection lost or no answer in time).
    pub writes_in_doubt: AtomicU64,
    /// Of those, writes whose server session could not be confirmed gone.
    pub writes_unsettled: AtomicU64,
    /// Bumped whenever a thread finds its connection lost: every other connection opened
    /// before is then suspect (a database restart ends them all) and is checked before
    /// its next use, so a write never fails on a connection known to be stale.
    pub losses: AtomicU64,
}

impl PgStats {
    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// The current-thread runtime a blocking thread drives its connection on.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
}

/// How to reach the database: the driver's settings and, unless `sslmode=disable`, the
/// TLS connector (`tls.rs`).
#[derive(Clone, Debug)]
pub(crate) struct PgConnect {
    pub(crate) config: tokio_postgres::Config,
    tls: Option<tls::PgTls>,
}

/// Opens a connection, its driver spawned on the current runtime.
pub(crate) async fn open(conn: &PgConnect) -> Result<Client, tokio_postgres::Error> {
    Ok(match &conn.tls {
        None => drive(conn.config.connect(NoTls).await?),
        Some(t) => drive(conn.config.connect(t.clone()).await?),
    })
}

/// Spawns a connection's driver: it ends when the connection is lost or the client
/// dropped, and the client sees it.
fn drive<S, T>((client, connection): (Client, tokio_postgres::Connection<S, T>)) -> Client
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}
