//! The pgvector backend: a PostgreSQL table with a `vector` column and its HNSW index.
//!
//! ```text
//!  start:  connect (retry with backoff up to start_wait_ms) ─► discover:
//!          pgvector >= 0.8, table, NOT NULL bigint id with a unique index, vector(n)
//!          column, the HNSW index's operator class ─► metric, EXPLAIN of the search
//!          (warns if it does not use the index), TABLESAMPLE of the vectors ─►
//!          routing centroids; every statement bounded (statement_timeout)
//!  run:    backend thread i ── its own connection (PgConn) on a current-thread runtime
//!          search: BEGIN; SET LOCAL ef_search, iterative_scan, statement_timeout
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgvector::Vector;
use shards::backend::sort_candidates;
use shards::{Candidate, Metric};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls, Statement};

use super::data::Dataset;
use super::StartError;
use crate::config::{ConfigError, PgvectorSection};
use crate::protocol::{Rejection, Status};

/// First pause between connection attempts; doubles up to the configured maximum.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
/// How long a statement may overrun its own `statement_timeout` (network, the server
/// noticing the timeout) before the client gives up on the connection.
const CLIENT_GRACE: Duration = Duration::from_millis(1000);
/// A write on a connection idle for longer checks it first (see `prepare_connection`).
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// How long a write in doubt waits for its old server session to be gone.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// What start-up found, shared by every backend thread.
pub struct PgTarget {
    pub dim: usize,
    pub metric: Metric,
    /// The HNSW index the searches use.
    pub index: String,
    /// The table as PostgreSQL prints it (schema-qualified where needed, quoted).
    pub table: String,
    conn: tokio_postgres::Config,
    sql: Sql,
    /// `BEGIN; SET LOCAL ...` of a search, before its `statement_timeout`.
    search_prelude: String,
    statement_timeout: Duration,
    reconnect_max: Duration,
    with_vectors: bool,
    has_payload: bool,
    pub stats: PgStats,
}

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
pub struct PgStats {
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

/// A search's rows, and whether there were as many as asked (a short answer is served
/// but never admitted: its missing tail is unknown, not absent).
pub struct PgAnswer {
    pub candidates: Vec<Candidate>,
    pub complete: bool,
}

/// Double quotes an identifier for SQL text.
/// Double-quotes an identifier for SQL text (also the load generator's SQL mode).
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// pgvector's distance operator for `metric`.
pub fn operator(metric: Metric) -> &'static str {
    match metric {
        Metric::L2Sq => "<->",
        Metric::InnerProduct => "<#>",
        Metric::Cosine => "<=>",
    }
}

/// The HNSW operator class of `metric`.
pub fn opclass(metric: Metric) -> &'static str {
    match metric {
        Metric::L2Sq => "vector_l2_ops",
        Metric::InnerProduct => "vector_ip_ops",
        Metric::Cosine => "vector_cosine_ops",
    }
}

fn metric_of_opclass(opclass: &str) -> Option<Metric> {
    match opclass {
        "vector_l2_ops" => Some(Metric::L2Sq),
        "vector_ip_ops" => Some(Metric::InnerProduct),
        "vector_cosine_ops" => Some(Metric::Cosine),
        _ => None,
    }
}

/// pgvector's distance in the cache's unit.
fn cache_distance(metric: Metric, d: f64) -> f32 {
    match metric {
        Metric::L2Sq => (d * d) as f32,
        Metric::InnerProduct | Metric::Cosine => d as f32,
    }
}

/// The current-thread runtime a blocking thread drives its connection on.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
}

/// A message for a database error without the driver's "db error: " prefix.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => e.to_string(),
    }
}

/// Whether `e` means the connection is gone (closed, broken, or ended by the server:
/// a FATAL error, an operator's shutdown, a connection exception), as opposed to an
/// error the server answered on a connection that is still good.
fn connection_gone(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    let Some(code) = e.code() else {
        return true; // I/O, protocol: nothing the server answered
    };
    let fatal = e
        .as_db_error()
        .is_some_and(|d| matches!(d.severity(), "FATAL" | "PANIC"));
    fatal || code.code().starts_with("08") || code.code().starts_with("57P")
}

/// Errors at connect time worth retrying: the server is not there yet, or starting.
fn is_transient(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        None => true,
        Some(c) => *c == SqlState::CANNOT_CONNECT_NOW || *c == SqlState::TOO_MANY_CONNECTIONS,
    }
}

/// The connection settings of `section`, with the password from its file or variable.
fn connection_config(section: &PgvectorSection) -> Result<tokio_postgres::Config, StartError> {
    let cfg_err = |m: String| StartError::Config(ConfigError::invalid("backend.pgvector", m));
    let mut c: tokio_postgres::Config = section
        .url
        .parse()
        .map_err(|e| cfg_err(format!("url: {e}")))?;
    if let Some(path) = &section.password_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| cfg_err(format!("password_file {}: {e}", path.display())))?;
        c.password(text.lines().next().unwrap_or_default());
    }
    if let Some(var) = &section.password_env {
        let pw =
            std::env::var(var).map_err(|_| cfg_err(format!("password_env: ${var} is not set")))?;
        c.password(pw);
    }
    c.connect_timeout(Duration::from_millis(section.connect_timeout_ms));
    c.application_name("akerd");
    Ok(c)
}

async fn open(conn: &tokio_postgres::Config) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = conn.connect(NoTls).await?;
    tokio::spawn(async move {
        // Ends when the connection is lost or the client dropped; the client sees it.
        let _ = connection.await;
    });
    Ok(client)
}

/// Connects at start, retrying what may be transient (refused, starting up) with
/// backoff until `start_wait_ms` has passed; then refuses to start.
async fn connect_at_start(
    conn: &tokio_postgres::Config,
    section: &PgvectorSection,
) -> Result<Client, StartError> {
    let t = Instant::now();
    let wait = Duration::from_millis(section.start_wait_ms);
    // tokio-postgres bounds the TCP connect only; the start-up handshake is bounded here.
    let handshake = Duration::from_millis(section.connect_timeout_ms);
    let mut pause = BACKOFF_FIRST;
    loop {
        let (why, transient) = match tokio::time::timeout(handshake, open(conn)).await {
            Ok(Ok(c)) => return Ok(c),
            Ok(Err(e)) => (describe(&e), is_transient(&e)),
            Err(_) => ("no answer within connect_timeout_ms".to_string(), true),
        };
        if !transient || t.elapsed() + pause > wait {
            return Err(StartError::Backend(format!(
                "pgvector: cannot connect to {} after {:.1} s (start_wait_ms = {}): {why}",
                section.url,
                t.elapsed().as_secs_f64(),
                section.start_wait_ms,
            )));
        }
        tracing::warn!(error = %why, retry_ms = pause.as_millis() as u64,
            "pgvector: database unreachable at start, retrying");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(section.reconnect_max_ms));
    }
}

/// Connects (waiting for the database as configured), checks the table, and returns
/// what the threads share plus a sample of the table's vectors for the router.
pub fn start(
    section: &PgvectorSection,
    metric: Option<Metric>,
    k_max: usize,
    delta: usize,
    store_vectors: bool,
    sample_rows: usize,
) -> Result<(PgTarget, Option<Dataset>), StartError> {
    let conn = connection_config(section)?;
    let rt = runtime()?;
    let client = rt.block_on(connect_at_start(&conn, section))?;
    // Every start-up query is bounded: a migration's lock on the table must not hang the
    // start. The budget covers the few statements below, each under statement_timeout.
    let statement = Duration::from_millis(section.statement_timeout_ms);
    let budget = statement * 8 + CLIENT_GRACE;
    let work = async {
        client
            .batch_execute(&format!(
                "SET statement_timeout = {}",
                section.statement_timeout_ms
            ))
            .await
            .map_err(|e| StartError::Backend(format!("pgvector: {}", describe(&e))))?;
        check_extension(&client, section).await?;
        let found = discover(&client, section, metric).await?;
        let ef = section.effective_ef_search(k_max, delta);
        let search_prelude = format!(
            "BEGIN; SET LOCAL hnsw.ef_search = {ef}; SET LOCAL hnsw.iterative_scan = {}; \
             SET LOCAL statement_timeout = ",
            section.iterative_scan.as_sql()
        );
        // On ip the cache's thresholds are angles to each answer's best result, which
        // take that result's vector even where the cache keeps none (shards/src/gap.rs).
        let with_vectors = store_vectors || found.metric == Metric::InnerProduct;
        let target = PgTarget {
            sql: sql(&found, section, with_vectors),
            dim: found.dim,
            metric: found.metric,
            index: found.index,
            table: found.table,
            conn,
            search_prelude,
            statement_timeout: Duration::from_millis(section.statement_timeout_ms),
            reconnect_max: Duration::from_millis(section.reconnect_max_ms),
            with_vectors,
            has_payload: section.payload_column.is_some(),
            stats: PgStats::default(),
        };
        let sample = sample(&client, &target, section, sample_rows).await?;
        if let Some(s) = &sample {
            check_plan(&client, &target, s.row(0), k_max + delta).await?;
        }
        tracing::info!(table = %target.table, dim = target.dim, metric = %target.metric,
            index = %target.index, ef_search = ef,
            iterative_scan = section.iterative_scan.as_sql(), "pgvector backend ready");
        Ok((target, sample))
    };
    rt.block_on(async { tokio::time::timeout(budget, work).await })
        .unwrap_or_else(|_| {
            Err(StartError::Backend(format!(
                "pgvector: the start-up checks of {} took over {:.1} s (a lock on the table?)",
                section.table,
                budget.as_secs_f64()
            )))
        })
}

/// pgvector 0.8 or later: `hnsw.iterative_scan`, which every search sets, is 0.8's.
async fn check_extension(c: &Client, section: &PgvectorSection) -> Result<(), StartError> {
    let refuse = |m: String| StartError::Backend(format!("pgvector: {m}"));
    let row = c
        .query_opt(
            "SELECT extversion FROM pg_extension WHERE extname = 'vector'",
            &[],
        )
        .await
        .map_err(|e| refuse(describe(&e)))?;
    let Some(row) = row else {
        return Err(refuse(format!(
            "the database of {} has no vector extension (CREATE EXTENSION vector)",
            section.url
        )));
    };
    let version: String = row.get(0);
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) < (0, 8) {
        return Err(refuse(format!(
            "pgvector {version} is installed; akerd needs 0.8 or later (hnsw.iterative_scan)"
        )));
    }
    Ok(())
}

struct Found {
    table: String,
    dim: usize,
    metric: Metric,
    index: String,
}

/// The table as akerd needs it: its name, dimension, metric and HNSW index, each
/// checked (a refusal names what to change).
async fn discover(
    c: &Client,
    section: &PgvectorSection,
    metric: Option<Metric>,
) -> Result<Found, StartError> {
    let name = section.table.as_str();
    let row = c
        .query_one("SELECT to_regclass($1)::text", &[&name])
        .await
        .map_err(refuse_db)?;
    let table: String = row
        .get::<_, Option<String>>(0)
        .ok_or_else(|| refuse(format!("table {name} does not exist")))?;
    let dim = check_columns(c, section, &table).await?;
    if let Some(want) = section.dim {
        if want != dim {
            return Err(refuse(format!(
                "column {} of {table} holds {dim}-d vectors; backend.pgvector.dim is {want}",
                section.vector_column
            )));
        }
    }
    check_unique_id(c, section).await?;
    let (index, metric) = choose_index(c, section, &table, metric).await?;
    Ok(Found {
        table,
        dim,
        metric,
        index,
    })
}

fn refuse(m: String) -> StartError {
    StartError::Backend(format!("pgvector: {m}"))
}

fn refuse_db(e: tokio_postgres::Error) -> StartError {
    refuse(describe(&e))
}

/// The id, vector and payload columns' types; the vectors' dimension.
async fn check_columns(
    c: &Client,
    section: &PgvectorSection,
    table: &str,
) -> Result<usize, StartError> {
    let name = section.table.as_str();
    let (id_type, _, id_not_null) = column_type(c, name, table, &section.id_column).await?;
    if id_type != "int8" {
        return Err(refuse(format!(
            "id column {} is {id_type}, not bigint: ids are the protocol's u64 up to i64::MAX",
            section.id_column
        )));
    }
    if !id_not_null {
        return Err(refuse(format!(
            "id column {} may be NULL: make it NOT NULL (a row without an id cannot be served)",
            section.id_column
        )));
    }
    let (vec_type, typmod, _) = column_type(c, name, table, &section.vector_column).await?;
    if vec_type != "vector" {
        return Err(refuse(format!(
            "column {} is {vec_type}, not pgvector's vector",
            section.vector_column
        )));
    }
    if let Some(p) = &section.payload_column {
        let (t, _, _) = column_type(c, name, table, p).await?;
        if t != "bytea" {
            return Err(refuse(format!("payload column {p} is {t}, not bytea")));
        }
    }
    if typmod > 0 {
        return Ok(typmod as usize);
    }
    // An untyped `vector` column: the dimension of a stored row.
    let q = format!(
        "SELECT vector_dims({v}) FROM {table} WHERE {v} IS NOT NULL LIMIT 1",
        v = quote_ident(&section.vector_column)
    );
    match c.query_opt(q.as_str(), &[]).await.map_err(refuse_db)? {
        Some(r) => Ok(r.get::<_, i32>(0) as usize),
        None => Err(refuse(format!(
            "column {} has no dimension (vector, not vector(n)) and the table \
             no row to take one from",
            section.vector_column
        ))),
    }
}

/// INSERT replaces a row by id: the id needs a unique index of its own.
async fn check_unique_id(c: &Client, section: &PgvectorSection) -> Result<(), StartError> {
    let unique: bool = c
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_index i \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
             WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indnkeyatts = 1 \
               AND i.indisvalid AND i.indimmediate \
               AND a.attname = $2 AND i.indpred IS NULL AND i.indexprs IS NULL)",
            &[&section.table, &section.id_column],
        )
        .await
        .map_err(refuse_db)?
        .get(0);
    if !unique {
        return Err(refuse(format!(
            "id column {} has no unique index (or primary key): INSERT replaces a row by id",
            section.id_column
        )));
    }
    Ok(())
}

/// The valid HNSW index on the vector column for `metric`, or, unset, the one metric
/// the column's indexes agree on.
async fn choose_index(
    c: &Client,
    section: &PgvectorSection,
    table: &str,
    metric: Option<Metric>,
) -> Result<(String, Metric), StartError> {
    let indexes = c
        .query(
            "SELECT ci.relname::text, opc.opcname::text, i.indisvalid FROM pg_index i \
             JOIN pg_class ci ON ci.oid = i.indexrelid \
             JOIN pg_am am ON am.oid = ci.relam \
             JOIN pg_opclass opc ON opc.oid = i.indclass[0] \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
             WHERE i.indrelid = to_regclass($1) AND am.amname = 'hnsw' \
               AND i.indnkeyatts = 1 AND a.attname = $2 \
               AND i.indpred IS NULL AND i.indexprs IS NULL \
             ORDER BY ci.relname",
            &[&section.table, &section.vector_column],
        )
        .await
        .map_err(refuse_db)?;
    let usable: Vec<(String, Metric)> = indexes
        .iter()
        .filter(|r| r.get::<_, bool>(2))
        .filter_map(|r| metric_of_opclass(&r.get::<_, String>(1)).map(|m| (r.get(0), m)))
        .collect();
    let listed = || {
        let v: Vec<String> = usable.iter().map(|(n, m)| format!("{n} ({m})")).collect();
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let column = &section.vector_column;
    if let Some(m) = metric {
        return usable
            .iter()
            .find(|(_, x)| *x == m)
            .cloned()
            .ok_or_else(|| {
                refuse(format!(
                "no valid HNSW index on {table} ({column}) for metric {m} (operator class {}); \
                 PostgreSQL would scan the whole table. Found: {}. Create one: CREATE INDEX \
                 ON {table} USING hnsw ({} {})",
                opclass(m),
                listed(),
                quote_ident(column),
                opclass(m)
            ))
            });
    }
    let mut metrics: Vec<Metric> = usable.iter().map(|(_, m)| *m).collect();
    metrics.dedup();
    match metrics.len() {
        1 => Ok(usable[0].clone()),
        0 => Err(refuse(format!(
            "no valid HNSW index on {table} ({column}) with vector_l2_ops, vector_ip_ops \
             or vector_cosine_ops; PostgreSQL would scan the whole table"
        ))),
        _ => Err(refuse(format!(
            "HNSW indexes for several metrics on {table} ({column}): {}; set cache.metric",
            listed()
        ))),
    }
}

/// A column's type name, type modifier and NOT NULL.
async fn column_type(
    c: &Client,
    name: &str,
    table: &str,
    col: &str,
) -> Result<(String, i32, bool), StartError> {
    let rows = c
        .query(
            "SELECT t.typname::text, a.atttypmod, a.attnotnull FROM pg_attribute a \
             JOIN pg_type t ON t.oid = a.atttypid \
             WHERE a.attrelid = to_regclass($1) AND a.attname = $2 \
               AND a.attnum > 0 AND NOT a.attisdropped",
            &[&name, &col],
        )
        .await
        .map_err(|e| StartError::Backend(format!("pgvector: {}", describe(&e))))?;
    match rows.first() {
        Some(r) => Ok((r.get(0), r.get(1), r.get(2))),
        None => Err(StartError::Backend(format!(
            "pgvector: table {table} has no column {col}"
        ))),
    }
}

fn sql(found: &Found, section: &PgvectorSection, with_vectors: bool) -> Sql {
    let (t, id, v) = (
        &found.table,
        quote_ident(&section.id_column),
        quote_ident(&section.vector_column),
    );
    let op = operator(found.metric);
    let vector_out = if with_vectors {
        format!(", {v}")
    } else {
        String::new()
    };
    let (payload_col, payload_val, payload_set) = match &section.payload_column {
        Some(p) => {
            let p = quote_ident(p);
            (
                format!(", {p}"),
                ", $3".to_string(),
                format!(", {p} = EXCLUDED.{p}"),
            )
        }
        None => Default::default(),
    };
    Sql {
        search_prefix: format!(
            "SELECT {id}, ({v} {op} $1)::float8{vector_out} FROM {t} ORDER BY {v} {op} $1 LIMIT "
        ),
        insert: format!(
            "INSERT INTO {t} ({id}, {v}{payload_col}) VALUES ($1, $2{payload_val}) \
             ON CONFLICT ({id}) DO UPDATE SET {v} = EXCLUDED.{v}{payload_set}"
        ),
        delete: format!("DELETE FROM {t} WHERE {id} = $1"),
    }
}

/// Up to `rows` vectors spread over the table (a Bernoulli sample when the table is
/// larger than that), for the routing centroids. `None`: an empty table.
async fn sample(
    c: &Client,
    target: &PgTarget,
    section: &PgvectorSection,
    rows: usize,
) -> Result<Option<Dataset>, StartError> {
    let db = |e: tokio_postgres::Error| StartError::Backend(format!("pgvector: {}", describe(&e)));
    let estimate: f32 = c
        .query_one(
            "SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)",
            &[&section.table],
        )
        .await
        .map_err(db)?
        .get(0);
    let v = quote_ident(&section.vector_column);
    let t = &target.table;
    let plain = format!("SELECT {v} FROM {t} WHERE {v} IS NOT NULL LIMIT {rows}");
    let mut got = Vec::new();
    if estimate as f64 > rows as f64 * 1.5 {
        let pct = (100.0 * rows as f64 * 1.2 / estimate as f64).min(100.0);
        // Bernoulli picks rows but reads every page; past a million rows, SYSTEM picks
        // whole pages (rows stored together come together; enough pages still spread
        // the centroids) and reads only those.
        let method = if estimate > 1e6 {
            "SYSTEM"
        } else {
            "BERNOULLI"
        };
        let q = format!(
            "SELECT {v} FROM {t} TABLESAMPLE {method} ({pct:.6}) REPEATABLE (7) \
             WHERE {v} IS NOT NULL LIMIT {rows}"
        );
        got = c.query(q.as_str(), &[]).await.map_err(db)?;
    }
    // Statistics may be stale (a table never analyzed says -1): fall back to the front.
    if got.len() < rows.min(64) {
        got = c.query(plain.as_str(), &[]).await.map_err(db)?;
    }
    if got.is_empty() {
        return Ok(None);
    }
    let mut flat = Vec::with_capacity(got.len() * target.dim);
    for r in &got {
        let x: Vector = r.get(0);
        let x = x.as_slice();
        if x.len() != target.dim {
            return Err(StartError::Backend(format!(
                "pgvector: column {} holds vectors of dimension {} and {}",
                section.vector_column,
                target.dim,
                x.len()
            )));
        }
        flat.extend_from_slice(x);
    }
    Ok(Some(
        Dataset::new(target.dim, flat).map_err(StartError::Data)?,
    ))
}

/// EXPLAIN of the search akerd sends, in its own settings.
pub async fn search_plan(
    c: &Client,
    target: &PgTarget,
    q: &[f32],
    n: usize,
) -> Result<String, tokio_postgres::Error> {
    // Prepared first: a query's preparation takes round trips of its own, which would
    // otherwise run after the pipeline's COMMIT, outside its settings.
    let explain = c
        .prepare(&format!("EXPLAIN {}", target.sql.search(n)))
        .await?;
    let prelude = format!(
        "{}{}",
        target.search_prelude,
        target.statement_timeout.as_millis()
    );
    let v = Vector::from(q.to_vec());
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&v];
    let (a, rows, b) = tokio::join!(
        biased;
        c.batch_execute(&prelude),
        c.query(&explain, &params),
        c.batch_execute("COMMIT")
    );
    a?;
    b?;
    Ok(rows?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n"))
}

/// Warns when PostgreSQL would not use the index for akerd's search (a small table can
/// make a sequential scan cheaper; a large one must not).
async fn check_plan(c: &Client, target: &PgTarget, q: &[f32], n: usize) -> Result<(), StartError> {
    let plan = search_plan(c, target, q, n)
        .await
        .map_err(|e| StartError::Backend(format!("pgvector: EXPLAIN: {}", describe(&e))))?;
    let uses = |name: &str| plan.contains(&format!("Index Scan using {name} "));
    if !uses(&target.index) && !uses(&quote_ident(&target.index)) {
        tracing::warn!(index = %target.index, plan = %plan,
            "pgvector: PostgreSQL does not plan the search on the HNSW index");
    }
    Ok(())
}

/// Statements prepared on one connection.
struct Live {
    client: Client,
    /// This connection's server session, to end it when a write's outcome is in doubt.
    session: Session,
    /// Search statements by limit (`k + Δ`), prepared on first use; at most one per
    /// distinct limit, and limits are bounded by `k_max + Δ`.
    search: HashMap<usize, Statement>,
    insert: Statement,
    delete: Statement,
}

/// A server session: its process id and start time (a pid alone may be reused once
/// the process has exited).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub pid: i32,
    pub started: String,
}

/// Why a pipelined statement failed, which decides what may follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FailKind {
    /// Nothing reached the database (no connection, deadline already past).
    NotSent,
    /// The server answered with an error and rolled the transaction back.
    RolledBack,
    /// The connection is gone; a write may or may not have committed.
    Gone,
    /// The server no longer knows the prepared statement (a pooler's new session, or
    /// the table changed shape): nothing ran; the connection is reopened to prepare
    /// again.
    Stale,
    /// No answer within the statement timeout plus a grace period: in doubt, and the
    /// server session may still be running it.
    NoAnswer,
}

struct Failure {
    rejection: Rejection,
    kind: FailKind,
    /// The session the statement was sent on (for settling a write in doubt).
    session: Option<Session>,
}

/// A write that failed; `in_doubt`: it may have committed (the caller must not trust
/// either outcome); `unsettled`: and its server session could not be confirmed gone,
/// so it might still commit: writes to the same id must wait until it is.
pub struct WriteError {
    pub rejection: Rejection,
    pub in_doubt: bool,
    pub unsettled: Option<Session>,
}

impl From<Failure> for WriteError {
    fn from(f: Failure) -> Self {
        WriteError {
            in_doubt: matches!(f.kind, FailKind::Gone | FailKind::NoAnswer),
            rejection: f.rejection,
            unsettled: None,
        }
    }
}

fn not_sent(rejection: Rejection) -> WriteError {
    WriteError {
        rejection,
        in_doubt: false,
        unsettled: None,
    }
}

/// A statement of the pipeline, with its parameters.
enum Stmt<'a> {
    Search(&'a Vector, usize),
    Insert(i64, &'a Vector, Option<&'a [u8]>),
    Delete(i64),
}

enum Outcome {
    Rows(Vec<tokio_postgres::Row>),
    Count(u64),
}

/// One backend thread's connection: opened at start, reopened with backoff when lost.
pub struct PgConn {
    rt: tokio::runtime::Runtime,
    target: Arc<PgTarget>,
    live: Option<Live>,
    /// No connection attempt before this instant.
    next_attempt: Instant,
    pause: Duration,
    /// A connection attempt failed or the connection was lost since the last one was
    /// opened: the next one opened is a reconnect.
    in_trouble: bool,
    /// `stats.losses` when this connection was opened or last checked.
    losses_seen: u64,
    last_used: Instant,
}

fn unavailable(m: impl Into<String>) -> Rejection {
    Rejection::new(Status::Unavailable, m)
}

fn deadline_exceeded() -> Rejection {
    Rejection::new(
        Status::DeadlineExceeded,
        "the request's deadline passed before the database answered",
    )
}

impl PgConn {
    pub fn new(target: Arc<PgTarget>) -> std::io::Result<PgConn> {
        let mut c = PgConn {
            rt: runtime()?,
            target,
            live: None,
            next_attempt: Instant::now(),
            pause: BACKOFF_FIRST,
            in_trouble: false,
            losses_seen: 0,
            last_used: Instant::now(),
        };
        c.reconnect_if_due(false);
        Ok(c)
    }

    pub fn is_up(&self) -> bool {
        self.live.is_some()
    }

    /// Before a connection is used: if another thread lost its connection since this
    /// one was checked, an empty query tells whether it is still good (one round trip,
    /// only after a loss); then a connection is opened if there is none and the
    /// backoff allows (or, for a request, other threads are connected), bounded by the
    /// connect and statement timeouts, never by a request's deadline: an attempt cut
    /// short would leave the pool unable to recover under short-deadline traffic.
    pub fn reconnect_if_due(&mut self, for_request: bool) {
        self.prepare_connection(for_request, false)
    }

    /// [`PgConn::reconnect_if_due`]; for a write (`write`), a connection idle for more
    /// than [`IDLE_CHECK`] is checked too: a write is not retried on another connection,
    /// so it should not be the one that finds a restart.
    fn prepare_connection(&mut self, for_request: bool, write: bool) {
        let losses = self.target.stats.losses.load(Ordering::Acquire);
        if let Some(live) = &self.live {
            let idle = write && self.last_used.elapsed() > IDLE_CHECK;
            if losses == self.losses_seen && !idle {
                return;
            }
            let bound = self
                .target
                .conn
                .get_connect_timeout()
                .copied()
                .unwrap_or(CLIENT_GRACE);
            let ping = self.rt.block_on(async {
                tokio::time::timeout(bound, live.client.simple_query("")).await
            });
            self.losses_seen = losses;
            match ping {
                Ok(Ok(_)) => {
                    self.last_used = Instant::now();
                    return;
                }
                Ok(Err(e)) => self.lost(&describe(&e)),
                Err(_) => self.lost("no answer to a liveness check"),
            }
        }
        // In backoff, but other threads are connected: the database is there, so this
        // thread's failure was its own; try now rather than fail the request.
        let others_up = self.target.stats.connections_up.load(Ordering::Relaxed) > 0;
        if Instant::now() < self.next_attempt && !(others_up && for_request) {
            return;
        }
        let t = &*self.target;
        // Opening and preparing are bounded too: preparing takes a lock on the table,
        // which another session may hold.
        let connect = t
            .conn
            .get_connect_timeout()
            .copied()
            .unwrap_or(CLIENT_GRACE);
        let bound = connect + t.statement_timeout;
        let attempt = async {
            let client = open(&t.conn).await?;
            let row = client
                .query_one(
                    "SELECT pid, backend_start::text FROM pg_stat_activity \
                     WHERE pid = pg_backend_pid()",
                    &[],
                )
                .await?;
            let session = Session {
                pid: row.get(0),
                started: row.get(1),
            };
            // Prepared under a statement_timeout (preparing waits for a lock on the
            // table); the statements outlive the transaction.
            let settings = format!(
                "BEGIN; SET LOCAL statement_timeout = {}",
                t.statement_timeout.as_millis().max(1)
            );
            let (a, insert, delete, b) = tokio::join!(
                biased;
                client.batch_execute(&settings),
                client.prepare(&t.sql.insert),
                client.prepare(&t.sql.delete),
                client.batch_execute("COMMIT")
            );
            a?;
            let (insert, delete) = (insert?, delete?);
            b?;
            Ok::<_, tokio_postgres::Error>(Live {
                client,
                session,
                search: HashMap::new(),
                insert,
                delete,
            })
        };
        let r = self
            .rt
            .block_on(async { tokio::time::timeout(bound, attempt).await });
        match r {
            Ok(Ok(live)) => {
                self.live = Some(live);
                self.losses_seen = t.stats.losses.load(Ordering::Acquire);
                self.last_used = Instant::now();
                self.pause = BACKOFF_FIRST;
                t.stats.connections_up.fetch_add(1, Ordering::Relaxed);
                if self.in_trouble {
                    PgStats::bump(&t.stats.reconnects);
                    tracing::info!(table = %t.table, "pgvector: database connection restored");
                }
                self.in_trouble = false;
            }
            Ok(Err(e)) => self.failed_attempt(&describe(&e)),
            Err(_) => {
                self.failed_attempt("no connection within the connect and statement timeouts")
            }
        }
    }

    fn failed_attempt(&mut self, why: &str) {
        self.in_trouble = true;
        let t = &*self.target;
        PgStats::bump(&t.stats.connect_failures);
        tracing::warn!(
            error = why,
            retry_ms = self.pause.as_millis() as u64,
            "pgvector: cannot connect to the database"
        );
        self.next_attempt = Instant::now() + self.pause;
        self.pause = (self.pause * 2).min(t.reconnect_max);
    }

    fn lost(&mut self, why: &str) {
        self.in_trouble = true;
        if self.live.is_some() {
            self.target.stats.losses.fetch_add(1, Ordering::AcqRel);
            tracing::warn!(error = why, "pgvector: database connection lost");
        }
        self.drop_connection(why);
    }

    /// Drops this thread's connection (the next use opens another at once).
    fn drop_connection(&mut self, why: &str) {
        if self.live.take().is_some() {
            self.target
                .stats
                .connections_up
                .fetch_sub(1, Ordering::Relaxed);
            tracing::debug!(why, "pgvector: connection dropped");
        }
        self.next_attempt = Instant::now();
    }

    /// The statement timeout for a request with `deadline`; `None` once it has passed.
    /// `statement_timeout`, shortened to what is left of the request's deadline.
    fn timeout_for(&self, deadline: Option<Instant>) -> Option<Duration> {
        let longest = self.target.statement_timeout;
        match deadline {
            None => Some(longest),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                (left >= Duration::from_millis(1)).then_some(left.min(longest))
            }
        }
    }

    /// Maps a failed statement: a cancellation at the deadline, an error the server
    /// answered, or a lost connection (dropped, to be reopened).
    fn statement_error(&mut self, e: tokio_postgres::Error) -> Failure {
        let session = self.live.as_ref().map(|l| l.session.clone());
        let fail = |rejection, kind| Failure {
            rejection,
            kind,
            session,
        };
        if e.code() == Some(&SqlState::QUERY_CANCELED) {
            PgStats::bump(&self.target.stats.statement_timeouts);
            return fail(deadline_exceeded(), FailKind::RolledBack);
        }
        let stale = e.code().is_some_and(|c| {
            *c == SqlState::INVALID_SQL_STATEMENT_NAME
                || (*c == SqlState::FEATURE_NOT_SUPPORTED
                    && describe(&e).contains("cached plan must not change result type"))
        });
        if stale {
            // This connection's statements only: the others are not suspect.
            let why = describe(&e);
            self.drop_connection(&why);
            return fail(unavailable(format!("database: {why}")), FailKind::Stale);
        }
        if !connection_gone(&e) {
            let r = unavailable(format!("database: {}", describe(&e)));
            return fail(r, FailKind::RolledBack);
        }
        let why = describe(&e);
        self.lost(&why);
        fail(
            unavailable(format!("database connection lost: {why}")),
            FailKind::Gone,
        )
    }

    /// A write's outcome is in doubt and its server session may still be running it
    /// (`pid`): end that session from a new connection and wait until it is gone, so
    /// the write cannot commit after a later write to the same id (the caller holds the
    /// id's stripe). Bounded by [`SETTLE_WAIT`]; false when it could not be confirmed
    /// (the database unreachable: counted and logged).
    pub fn settle(&mut self, session: &Session) -> bool {
        let t = &*self.target;
        let (pid, started) = (session.pid, session.started.as_str());
        let work = async {
            let c = open(&t.conn).await?;
            c.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE pid = $1 AND backend_start::text = $2",
                &[&pid, &started],
            )
            .await?;
            loop {
                let n: i64 = c
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity \
                         WHERE pid = $1 AND backend_start::text = $2",
                        &[&pid, &started],
                    )
                    .await?
                    .get(0);
                if n == 0 {
                    return Ok::<(), tokio_postgres::Error>(());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let settled = matches!(
            self.rt
                .block_on(async { tokio::time::timeout(SETTLE_WAIT, work).await }),
            Ok(Ok(()))
        );
        if !settled {
            tracing::error!(
                pid,
                "pgvector: a write in doubt is not settled yet: its session may still \
                 commit it; writes to ids of its stripe wait until it is gone"
            );
        }
        settled
    }

    /// Runs `BEGIN; SET LOCAL ...`, one prepared statement and `COMMIT` in one round
    /// trip, bounded by the statement timeout plus a grace period. A search limit not
    /// prepared on this connection yet is prepared inside the same transaction (under
    /// its statement_timeout: preparing takes a lock on the table), one round trip more.
    fn pipelined(
        &mut self,
        prelude: String,
        timeout: Duration,
        stmt: Stmt<'_>,
    ) -> Result<Outcome, Failure> {
        let Some(live) = self.live.as_ref() else {
            return Err(Failure {
                rejection: unavailable("database unreachable; reconnecting"),
                kind: FailKind::NotSent,
                session: None,
            });
        };
        if live.client.is_closed() {
            // Found closed before anything was sent: nothing is in doubt.
            self.lost("connection closed");
            return Err(Failure {
                rejection: unavailable("database connection lost; reconnecting"),
                kind: FailKind::NotSent,
                session: None,
            });
        }
        let session = live.session.clone();
        let (search_text, cached) = match stmt {
            Stmt::Search(_, n) => (
                Some(self.target.sql.search(n)),
                live.search.get(&n).cloned(),
            ),
            _ => (None, None),
        };
        let mut prepared = None;
        let mut rollback_failed = false;
        let started = Instant::now();
        let r = self.rt.block_on(async {
            let c = &live.client;
            let work = async {
                let mut prelude_sent = false;
                let search = match (&search_text, cached) {
                    (Some(_), Some(st)) => Some(st),
                    (Some(text), None) => {
                        let (a, p) =
                            tokio::join!(biased; c.batch_execute(&prelude), c.prepare(text));
                        prelude_sent = true;
                        match (a, p) {
                            (Ok(()), Ok(st)) => {
                                prepared = Some(st.clone());
                                Some(st)
                            }
                            (a, p) => {
                                rollback_failed = c.batch_execute("ROLLBACK").await.is_err();
                                return Err(a.err().or(p.err()).expect("one of them failed"));
                            }
                        }
                    }
                    (None, _) => None,
                };
                let run = async {
                    match stmt {
                        Stmt::Search(v, _) => c
                            .query(search.as_ref().expect("prepared"), &[v])
                            .await
                            .map(Outcome::Rows),
                        Stmt::Insert(id, v, None) => {
                            c.execute(&live.insert, &[&id, v]).await.map(Outcome::Count)
                        }
                        Stmt::Insert(id, v, Some(p)) => c
                            .execute(&live.insert, &[&id, v, &p])
                            .await
                            .map(Outcome::Count),
                        Stmt::Delete(id) => {
                            c.execute(&live.delete, &[&id]).await.map(Outcome::Count)
                        }
                    }
                };
                // In this order on the wire: each future sends at its first poll.
                let (a, out, b) = tokio::join!(
                    biased;
                    async {
                        if prelude_sent {
                            // The preparation took part of the time: what is left.
                            let left = timeout.saturating_sub(started.elapsed());
                            let ms = left.as_millis().max(1);
                            c.batch_execute(&format!("SET LOCAL statement_timeout = {ms}"))
                                .await
                        } else {
                            c.batch_execute(&prelude).await
                        }
                    },
                    run,
                    c.batch_execute("COMMIT")
                );
                a?;
                let out = out?;
                b?;
                Ok::<Outcome, tokio_postgres::Error>(out)
            };
            tokio::time::timeout(timeout + CLIENT_GRACE, work).await
        });
        if let (Some(st), Stmt::Search(_, n), Some(live)) = (prepared, &stmt, self.live.as_mut()) {
            live.search.insert(*n, st);
        }
        if rollback_failed {
            self.lost("ROLLBACK after a failed PREPARE");
        }
        match r {
            Ok(Ok(v)) => {
                self.last_used = Instant::now();
                Ok(v)
            }
            Ok(Err(e)) => Err(self.statement_error(e)),
            Err(_) => {
                // The server did not answer within its own timeout: the connection's
                // state is unknown, so it is not reused.
                self.lost("no answer within the statement timeout");
                PgStats::bump(&self.target.stats.statement_timeouts);
                Err(Failure {
                    rejection: deadline_exceeded(),
                    kind: FailKind::NoAnswer,
                    session: Some(session),
                })
            }
        }
    }

    /// The `n` nearest rows to `q`. A search is idempotent: when the connection turns
    /// out to be lost, one fresh connection is tried before failing.
    pub fn search(
        &mut self,
        q: &[f32],
        n: usize,
        deadline: Option<Instant>,
    ) -> Result<PgAnswer, Rejection> {
        let mut retried = false;
        loop {
            self.reconnect_if_due(true);
            let timeout = self.timeout_for(deadline).ok_or_else(deadline_exceeded)?;
            let prelude = format!(
                "{}{}",
                self.target.search_prelude,
                timeout.as_millis().max(1)
            );
            let query = Vector::from(q.to_vec());
            match self.pipelined(prelude, timeout, Stmt::Search(&query, n)) {
                Ok(Outcome::Rows(rows)) => return Ok(self.answer(rows, n)),
                Ok(Outcome::Count(_)) => unreachable!("a search returns rows"),
                // A connection found gone (not a slow one), or its statements stale:
                // once more on a new one.
                Err(f) if matches!(f.kind, FailKind::Gone | FailKind::Stale) && !retried => {
                    retried = true;
                    tracing::debug!(error = %f.rejection.message,
                        "pgvector: search retried on a new connection");
                }
                Err(f) => return Err(f.rejection),
            }
        }
    }

    fn answer(&self, rows: Vec<tokio_postgres::Row>, n: usize) -> PgAnswer {
        let t = &*self.target;
        let mut complete = rows.len() >= n;
        let mut candidates = Vec::with_capacity(rows.len());
        for r in rows {
            // A NULL or negative id is no protocol id; a NULL vector has no distance
            // (NaN, e.g. cosine to a zero vector, neither): such rows are skipped, and
            // the answer is then not complete.
            let id: Option<i64> = r.get(0);
            let Some(id) = id.and_then(|i| u64::try_from(i).ok()) else {
                PgStats::bump(&t.stats.rows_skipped);
                complete = false;
                continue;
            };
            let d: Option<f64> = r.get(1);
            let distance = cache_distance(t.metric, d.unwrap_or(f64::NAN));
            if !distance.is_finite() {
                PgStats::bump(&t.stats.rows_skipped);
                complete = false;
                continue;
            }
            let mut c = Candidate::new(id, distance);
            if t.with_vectors {
                let v: Option<Vector> = r.get(2);
                c.vector = v.map(|v| Arc::from(v.as_slice()));
            }
            candidates.push(c);
        }
        // relaxed_order iterative scans may return rows slightly out of order.
        sort_candidates(&mut candidates);
        PgAnswer {
            candidates,
            complete,
        }
    }

    fn write_prelude(timeout: Duration) -> String {
        format!(
            "BEGIN; SET LOCAL statement_timeout = {}",
            timeout.as_millis().max(1)
        )
    }

    fn db_id(id: u64) -> Result<i64, Rejection> {
        i64::try_from(id).map_err(|_| {
            Rejection::new(
                Status::BadRequest,
                format!("id {id} is above i64::MAX: the table's id column is a bigint"),
            )
        })
    }

    /// Upserts `id`, committed before this returns `Ok`.
    pub fn insert(
        &mut self,
        id: u64,
        v: &[f32],
        payload: &[u8],
        deadline: Option<Instant>,
    ) -> Result<(), WriteError> {
        let db_id = Self::db_id(id).map_err(not_sent)?;
        if !payload.is_empty() && !self.target.has_payload {
            return Err(not_sent(Rejection::new(
                Status::Unsupported,
                "INSERT with a payload: backend.pgvector has no payload_column",
            )));
        }
        self.prepare_connection(true, true);
        let timeout = self
            .timeout_for(deadline)
            .ok_or_else(|| not_sent(deadline_exceeded()))?;
        let vector = Vector::from(v.to_vec());
        let payload = self.target.has_payload.then_some(payload);
        let stmt = Stmt::Insert(db_id, &vector, payload);
        self.write(timeout, stmt).map(drop)
    }

    /// A write's pipeline; a lost connection's session is settled before returning (a
    /// session that gave no answer is settled inside `pipelined`).
    fn write(&mut self, timeout: Duration, stmt: Stmt<'_>) -> Result<Outcome, WriteError> {
        match self.pipelined(Self::write_prelude(timeout), timeout, stmt) {
            Ok(o) => Ok(o),
            Err(f) => {
                let doubt = matches!(f.kind, FailKind::Gone | FailKind::NoAnswer);
                let session = f.session.clone().filter(|_| doubt);
                let mut e = WriteError::from(f);
                if doubt {
                    PgStats::bump(&self.target.stats.writes_in_doubt);
                }
                if let Some(s) = session {
                    if !self.settle(&s) {
                        PgStats::bump(&self.target.stats.writes_unsettled);
                        e.unsettled = Some(s);
                    }
                }
                Err(e)
            }
        }
    }

    /// Deletes `id`, committed before this returns; whether a row was there.
    pub fn delete(&mut self, id: u64, deadline: Option<Instant>) -> Result<bool, WriteError> {
        let Ok(db_id) = i64::try_from(id) else {
            // Such an id cannot be in a bigint column.
            return Ok(false);
        };
        self.prepare_connection(true, true);
        let timeout = self
            .timeout_for(deadline)
            .ok_or_else(|| not_sent(deadline_exceeded()))?;
        match self.write(timeout, Stmt::Delete(db_id))? {
            Outcome::Count(n) => Ok(n > 0),
            Outcome::Rows(_) => unreachable!("a delete returns a count"),
        }
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        if self.live.take().is_some() {
            self.target
                .stats
                .connections_up
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("id"), "\"id\"");
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
    }

    #[test]
    fn distances_are_in_the_cache_units() {
        // <-> is plain L2: the cache keeps it squared.
        assert_eq!(cache_distance(Metric::L2Sq, 3.0), 9.0);
        assert_eq!(cache_distance(Metric::InnerProduct, -2.5), -2.5);
        assert_eq!(cache_distance(Metric::Cosine, 0.25), 0.25);
        assert_eq!(
            metric_of_opclass("vector_ip_ops"),
            Some(Metric::InnerProduct)
        );
        assert_eq!(metric_of_opclass("halfvec_l2_ops"), None);
    }
}
