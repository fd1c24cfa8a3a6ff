//! Start-time discovery: connect (waiting for the database as configured), check that
//! the table is one akerd can serve, and take a sample of its vectors for the router.
//!
//! ```text
//!  connect_at_start ─► check_extension (pgvector >= 0.8)
//!                  ─► discover: table ─► columns (bigint NOT NULL id, vector(n),
//!                     bytea payload) ─► unique index on the id ─► HNSW index ─► metric
//!                  ─► sample (TABLESAMPLE, else the front) ─► check_plan (EXPLAIN)
//! ```
//!
//! Every refusal names what to change; every statement runs under `statement_timeout`,
//! and the whole under a budget: a migration's lock on the table must not hang a start.

use std::time::{Duration, Instant};

use pgvector::Vector;
use shards::Metric;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::replica::Replicas;
use super::sql::{describe, metric_of_opclass, opclass, operator, quote_ident};
use super::{open, runtime, PgConnect, PgStats, PgTarget, Sql, BACKOFF_FIRST, CLIENT_GRACE};
use crate::config::{ConfigError, PgvectorSection};
use crate::service::data::Dataset;
use crate::service::StartError;

/// Errors at connect time worth retrying: the server is not there yet, or starting.
fn is_transient(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        None => true,
        Some(c) => *c == SqlState::CANNOT_CONNECT_NOW || *c == SqlState::TOO_MANY_CONNECTIONS,
    }
}

/// The connection settings of `section`, with the password from its file or variable and
/// the TLS its url's `sslmode` / `sslrootcert` ask for.
pub(crate) fn connection_config(section: &PgvectorSection) -> Result<PgConnect, StartError> {
    connect_to(section, &section.url, "url")
}

/// Each of `replica_urls` as configured, with its settings: parsed as `url` is, the same
/// password, its own `sslmode` / `sslrootcert`.
pub(crate) fn replica_configs(
    section: &PgvectorSection,
) -> Result<Vec<(String, PgConnect)>, StartError> {
    let each = |(i, u): (usize, &String)| {
        connect_to(section, u, &format!("replica_urls[{i}]")).map(|c| (u.clone(), c))
    };
    section.replica_urls.iter().enumerate().map(each).collect()
}

/// The settings of `url` (the config's key `key`, for errors), as [`connection_config`].
fn connect_to(section: &PgvectorSection, url: &str, key: &str) -> Result<PgConnect, StartError> {
    let cfg_err = |m: String| StartError::Config(ConfigError::invalid("backend.pgvector", m));
    let split = super::tls::split_url(url).map_err(|e| cfg_err(format!("{key}: {e}")))?;
    let tls = super::tls::connector(split.mode, split.root_cert.as_deref())
        .map_err(|e| cfg_err(format!("{key}: {e}")))?;
    let mut c: tokio_postgres::Config = split
        .url
        .parse()
        .map_err(|e| cfg_err(format!("{key}: {e}")))?;
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
    Ok(PgConnect { config: c, tls })
}

/// Connects at start, retrying what may be transient (refused, starting up) with
/// backoff until `start_wait_ms` has passed; then refuses to start.
async fn connect_at_start(
    conn: &PgConnect,
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
    let replicas = Replicas::new(replica_configs(section)?);
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
        // READ COMMITTED whatever the role's, database's or url's default: each
        // statement its own snapshot, which a replica's check relies on (`replica.rs`).
        let search_prelude = format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL hnsw.ef_search = {ef}; SET LOCAL hnsw.iterative_scan = {}; \
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
            changes: Default::default(),
            replicas,
        };
        let sample = sample(&client, &target, section, sample_rows).await?;
        if let Some(s) = &sample {
            check_plan(&client, &target, s.row(0), k_max + delta).await?;
        }
        tracing::info!(table = %target.table, dim = target.dim, metric = %target.metric,
            index = %target.index, ef_search = ef,
            iterative_scan = section.iterative_scan.as_sql(),
            replicas = target.replicas.len(), "pgvector backend ready");
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
