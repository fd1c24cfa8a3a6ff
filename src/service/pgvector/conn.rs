//! One backend thread's connection to PostgreSQL (`PgConn`): opened at start, checked
//! after another thread's loss, reopened with backoff; its statements prepared once and
//! sent pipelined, each in its own transaction with its settings.
//!
//! ```text
//!  search:  BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL ... ;
//!           statement_timeout = <what the deadline leaves>
//!           │ prepared SELECT ... LIMIT <n>     (prepared on first use of n, inside
//!           │ COMMIT                             the same transaction)
//!  write:   BEGIN; SET LOCAL statement_timeout │ prepared INSERT / DELETE │ COMMIT
//!  failure: NotSent │ RolledBack │ Stale (prepare again) │ Gone │ NoAnswer
//!           (a write Gone or NoAnswer is in doubt: `in_doubt.rs`)
//! ```
//!
//! Each statement kind is a type with what it answers (`Piped::Out`): a search its rows,
//! a write its row count, so no caller meets an answer of another kind.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgvector::Vector;
use shards::backend::sort_candidates;
use shards::Candidate;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::PgLsn;
use tokio_postgres::{Client, Row, Statement};

use super::in_doubt::{not_sent, Session, WriteError};
use super::pgoutput::Lsn;
use super::sql::{cache_distance, describe};
use super::{open, runtime, PgStats, PgTarget, Sql, BACKOFF_FIRST, CLIENT_GRACE};
use crate::protocol::{Rejection, Status};

/// A write on a connection idle for longer checks it first (see `prepare_connection`).
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// A search's rows, and whether there were as many as asked (a short answer is served
/// but never admitted: its missing tail is unknown, not absent).
pub struct PgAnswer {
    pub candidates: Vec<Candidate>,
    pub complete: bool,
}

/// Whether `e` means the connection is gone (closed, broken, or ended by the server:
/// a FATAL error, an operator's shutdown, a connection exception), as opposed to an
/// error the server answered on a connection that is still good.
pub(super) fn connection_gone(e: &tokio_postgres::Error) -> bool {
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

/// Whether the server no longer knows a prepared statement (a pooler's new session, or
/// the table changed shape): the connection is reopened to prepare again.
pub(super) fn stale_statement(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::INVALID_SQL_STATEMENT_NAME
            || (*c == SqlState::FEATURE_NOT_SUPPORTED
                && describe(e).contains("cached plan must not change result type"))
    })
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

impl Live {
    /// Opens a connection, learns its server session and prepares the writes.
    async fn open(t: &PgTarget) -> Result<Live, tokio_postgres::Error> {
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
        Ok(Live {
            client,
            session,
            search: HashMap::new(),
            insert,
            delete,
        })
    }
}

/// Why a pipelined statement failed, which decides what may follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FailKind {
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

pub(super) struct Failure {
    pub(super) rejection: Rejection,
    pub(super) kind: FailKind,
    /// The session the statement was sent on (for settling a write in doubt).
    pub(super) session: Option<Session>,
}

/// A statement of the pipeline, with its parameters; `Out` is what it answers (a
/// search its rows, a write its row count).
pub(super) trait Piped {
    type Out;
    async fn run(&self, c: &Client, st: &Statement) -> Result<Self::Out, tokio_postgres::Error>;
    /// Whether the pipeline reads the WAL position after its COMMIT (writes: the
    /// change stream has applied the write once it has passed that position).
    const POSITION: bool = false;
}

/// Where a [`Piped`] statement is prepared on the primary's connection ([`Live`]); a
/// replica keeps its own (`replica.rs`).
trait OnLive: Piped {
    /// The statement prepared for it on `live`, or, not prepared there yet (a search
    /// limit's first use on this connection), the text to prepare.
    fn statement(&self, live: &Live, sql: &Sql) -> Result<Statement, String>;
    /// Keeps the statement prepared from the text `statement` returned.
    fn keep(&self, _live: &mut Live, _prepared: Statement) {}
}

/// The `n` nearest rows to `query`.
struct Search<'a> {
    query: &'a Vector,
    n: usize,
}

impl Piped for Search<'_> {
    type Out = Vec<Row>;

    async fn run(&self, c: &Client, st: &Statement) -> Result<Vec<Row>, tokio_postgres::Error> {
        c.query(st, &[self.query]).await
    }
}

impl OnLive for Search<'_> {
    fn statement(&self, live: &Live, sql: &Sql) -> Result<Statement, String> {
        live.search
            .get(&self.n)
            .cloned()
            .ok_or_else(|| sql.search(self.n))
    }

    fn keep(&self, live: &mut Live, prepared: Statement) {
        live.search.insert(self.n, prepared);
    }
}

/// Upserts a row (with its payload when the table has a payload column).
struct Insert<'a> {
    id: i64,
    vector: &'a Vector,
    payload: Option<&'a [u8]>,
}

impl OnLive for Insert<'_> {
    fn statement(&self, live: &Live, _: &Sql) -> Result<Statement, String> {
        Ok(live.insert.clone())
    }
}

impl Piped for Insert<'_> {
    type Out = u64;
    const POSITION: bool = true;

    async fn run(&self, c: &Client, st: &Statement) -> Result<u64, tokio_postgres::Error> {
        match self.payload {
            None => c.execute(st, &[&self.id, self.vector]).await,
            Some(p) => c.execute(st, &[&self.id, self.vector, &p]).await,
        }
    }
}

/// Deletes a row by id.
struct Delete(i64);

impl OnLive for Delete {
    fn statement(&self, live: &Live, _: &Sql) -> Result<Statement, String> {
        Ok(live.delete.clone())
    }
}

impl Piped for Delete {
    type Out = u64;
    const POSITION: bool = true;

    async fn run(&self, c: &Client, st: &Statement) -> Result<u64, tokio_postgres::Error> {
        c.execute(st, &[&self.0]).await
    }
}

/// What preparing a search inside its transaction left behind.
#[derive(Default)]
pub(super) struct Prepared {
    /// The statement prepared, for the connection to keep.
    pub(super) statement: Option<Statement>,
    /// The PREPARE failed and so did the ROLLBACK after it: the connection is unusable.
    pub(super) rollback_failed: bool,
}

/// The WAL's insert position after a write's COMMIT: at or past the commit's end.
async fn position(c: &Client) -> Result<Option<Lsn>, tokio_postgres::Error> {
    let row = c
        .query_one("SELECT pg_current_wal_insert_lsn()", &[])
        .await?;
    Ok(Some(u64::from(row.get::<_, PgLsn>(0))))
}

/// The pipeline of one statement on `c` (see [`PgConn::pipelined`]), with the WAL
/// position after its COMMIT where `S::POSITION` asks for it.
pub(super) async fn send<S: Piped>(
    c: &Client,
    prelude: &str,
    timeout: Duration,
    statement: Result<Statement, String>,
    stmt: &S,
    prep: &mut Prepared,
) -> Result<(S::Out, Option<Lsn>), tokio_postgres::Error> {
    let started = Instant::now();
    let (st, prelude_sent) = match statement {
        Ok(st) => (st, false),
        Err(text) => {
            let (a, p) = tokio::join!(biased; c.batch_execute(prelude), c.prepare(&text));
            match (a, p) {
                (Ok(()), Ok(st)) => {
                    prep.statement = Some(st.clone());
                    (st, true)
                }
                (Err(e), _) | (Ok(()), Err(e)) => {
                    prep.rollback_failed = c.batch_execute("ROLLBACK").await.is_err();
                    return Err(e);
                }
            }
        }
    };
    // In this order on the wire: each future sends at its first poll.
    let (a, out, b, pos) = tokio::join!(
        biased;
        async {
            if prelude_sent {
                // The preparation took part of the time: what is left.
                let left = timeout.saturating_sub(started.elapsed());
                let ms = left.as_millis().max(1);
                c.batch_execute(&format!("SET LOCAL statement_timeout = {ms}"))
                    .await
            } else {
                c.batch_execute(prelude).await
            }
        },
        stmt.run(c, &st),
        c.batch_execute("COMMIT"),
        async {
            match S::POSITION {
                true => position(c).await,
                false => Ok(None),
            }
        }
    );
    a?;
    let out = out?;
    b?;
    // A write committed whatever its position read says; a lost position is a lost
    // connection, found by the next statement.
    Ok((out, pos.unwrap_or(None)))
}

/// One backend thread's connection: opened at start, reopened with backoff when lost.
pub struct PgConn {
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) target: Arc<PgTarget>,
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

pub(super) fn deadline_exceeded() -> Rejection {
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
    pub(crate) fn reconnect_if_due(&mut self, for_request: bool) {
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
                .config
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
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(CLIENT_GRACE);
        let bound = connect + t.statement_timeout;
        let r = self
            .rt
            .block_on(async { tokio::time::timeout(bound, Live::open(t)).await });
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
    pub(super) fn timeout_for(&self, deadline: Option<Instant>) -> Option<Duration> {
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
        if stale_statement(&e) {
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

    /// Runs `BEGIN; SET LOCAL ...`, one prepared statement and `COMMIT` in one round
    /// trip, bounded by the statement timeout plus a grace period. A search limit not
    /// prepared on this connection yet is prepared inside the same transaction (under
    /// its statement_timeout: preparing takes a lock on the table), one round trip more.
    fn pipelined<S: OnLive>(
        &mut self,
        prelude: String,
        timeout: Duration,
        stmt: &S,
    ) -> Result<(S::Out, Option<Lsn>), Failure> {
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
        let statement = stmt.statement(live, &self.target.sql);
        let mut prep = Prepared::default();
        let r = self.rt.block_on(async {
            let work = send(&live.client, &prelude, timeout, statement, stmt, &mut prep);
            tokio::time::timeout(timeout + CLIENT_GRACE, work).await
        });
        if let (Some(st), Some(live)) = (prep.statement, self.live.as_mut()) {
            stmt.keep(live, st);
        }
        if prep.rollback_failed {
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
            match self.pipelined(prelude, timeout, &Search { query: &query, n }) {
                Ok((rows, _)) => return Ok(self.answer(rows, n)),
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

    /// The primary's WAL insert position now, on this thread's connection (read-replica
    /// choice after a write through akerd whose position is unknown: `replica.rs`);
    /// `None` when there is no connection or no answer within the statement timeout.
    pub(super) fn wal_insert_position(&mut self) -> Option<Lsn> {
        self.reconnect_if_due(true);
        let live = self.live.as_ref()?;
        let bound = self.target.statement_timeout;
        let r = self
            .rt
            .block_on(async { tokio::time::timeout(bound, position(&live.client)).await });
        match r {
            Ok(Ok(at)) => at,
            Ok(Err(e)) => {
                let _ = self.statement_error(e);
                None
            }
            Err(_) => {
                self.lost("no answer to a WAL position read");
                None
            }
        }
    }

    pub(super) fn answer(&self, rows: Vec<Row>, n: usize) -> PgAnswer {
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

    /// Upserts `id`, committed before this returns `Ok` (with the WAL position after
    /// the commit, when it could be read).
    pub(crate) fn insert(
        &mut self,
        id: u64,
        v: &[f32],
        payload: &[u8],
        deadline: Option<Instant>,
    ) -> Result<Option<Lsn>, WriteError> {
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
        let stmt = Insert {
            id: db_id,
            vector: &vector,
            payload: self.target.has_payload.then_some(payload),
        };
        self.write(timeout, &stmt).map(|(_, at)| at)
    }

    /// A write's pipeline; a write in doubt has its server session settled before
    /// this returns (`in_doubt.rs`).
    fn write<S: OnLive<Out = u64>>(
        &mut self,
        timeout: Duration,
        stmt: &S,
    ) -> Result<(u64, Option<Lsn>), WriteError> {
        match self.pipelined(Self::write_prelude(timeout), timeout, stmt) {
            Ok(done) => Ok(done),
            Err(f) => Err(self.write_failed(f)),
        }
    }

    /// Deletes `id`, committed before this returns; whether a row was there, and the
    /// WAL position after the commit.
    pub(crate) fn delete(
        &mut self,
        id: u64,
        deadline: Option<Instant>,
    ) -> Result<(bool, Option<Lsn>), WriteError> {
        let Ok(db_id) = i64::try_from(id) else {
            // Such an id cannot be in a bigint column.
            return Ok((false, None));
        };
        self.prepare_connection(true, true);
        let timeout = self
            .timeout_for(deadline)
            .ok_or_else(|| not_sent(deadline_exceeded()))?;
        self.write(timeout, &Delete(db_id))
            .map(|(n, at)| (n > 0, at))
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
