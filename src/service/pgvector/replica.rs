//! Misses to read replicas (`backend.pgvector.replica_urls`): a search the backend
//! answers may run on a streaming replica of the primary instead, but only one that has
//! replayed at least what the cache already holds, checked in the search's own round
//! trip; otherwise its answer is discarded and the primary answers.
//!
//! ```text
//!  miss ─► node floor = max(applied   the change stream, in every shard
//!                           written)  akerd's own writes, WAL after their COMMIT
//!          request floor = max(node floor, AT_POSITION)  read-your-writes
//!          no floor: not following, past max_staleness_ms, a write's position unknown
//!          and the primary unreadable ─► the primary
//!       ─► replica i (round robin; its connection up on this thread; not passed over)
//!            BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL ...;
//!            SELECT <replay position>; prepared search; COMMIT
//!            (bounded: half of min(statement_timeout, what the deadline leaves))
//!            replayed >= request floor ─► its answer             pg_replica_searches
//!            behind the node floor (or not in recovery) ─► discarded, i passed over
//!                           for BEHIND_SKIP (reconnect_ms_max), the primary
//!                                                                pg_replica_behind
//!            behind only AT_POSITION ─► discarded, this request on the primary
//!                                                                pg_replica_behind
//!            recovery conflict (40001, 57P04) ─► i passed over for BEHIND_SKIP,
//!                                                the primary     pg_replica_conflicts
//!            timed out, cancelled, lost, failed ─► i passed over for FAILED_SKIP,
//!                           the primary; a lost connection reopened in the background
//!                                                                pg_replica_failed
//!       ─► no replica may answer ─► the primary (`PgConn::search`), in what the
//!          deadline leaves
//! ```
//!
//! **Why it must be checked.** The cache has applied every change up to `applied`; a
//! deleted row is stripped from its entries, and a miss whose ticket comes after that
//! is guarded by nothing else. A replica behind `applied` still holds the row: its
//! answer would carry it into the cache, to be served again. An insert the cache has
//! applied would likewise be missing from that answer.
//!
//! **Why READ COMMITTED, the check first.** The transaction says so itself (`BEGIN
//! ISOLATION LEVEL READ COMMITTED`): a role's or database's
//! `default_transaction_isolation` (replicated to the standby) or one in the url's
//! `options` must not change it. Each statement takes its snapshot as it starts. The
//! check reads `pg_last_wal_replay_lsn()` while it runs; recovery publishes that
//! position only after the record's redo (a commit is then out of the running
//! transactions). The search starts after the check has finished (a session runs its
//! statements one after another), so its snapshot sees every transaction committed up
//! to the position checked, and the check vouches for it. Under REPEATABLE READ the
//! transaction's one snapshot would be the check's own, taken as the check starts,
//! before the function reads the position: replay could pass the floor in between, and
//! the check would vouch for an older snapshot.
//!
//! **Why the request's position passes nothing over.** AT_POSITION is the client's: a
//! replica behind it (or a bogus position far ahead of any WAL) sends that request to
//! the primary, nothing more. Only a replica behind what the node itself holds (the
//! stream's applied position, akerd's own writes) is passed over by every thread.
//!
//! **Time.** A replica attempt may take at most half of `statement_timeout` and half of
//! what the request's deadline leaves (`attempt_bounds`), so the primary, asked after
//! it, keeps at least as much as the replica had. A replica that timed out, was
//! cancelled or failed is passed over for [`FAILED_SKIP`]: a slow replica costs one
//! slow miss per that, not one per miss. A replica's connections are opened as tasks
//! on the backend thread's runtime: they progress while the thread waits on any
//! statement (or idles), so a replica that does not answer never holds a miss up; a
//! miss uses only connections already up.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgvector::Vector;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{PgLsn, ToSql};
use tokio_postgres::{Client, Row, Statement};

use super::changes::ChangeFeed;
use super::conn::{
    connection_gone, deadline_exceeded, send, stale_statement, PgAnswer, Piped, Prepared,
};
use super::pgoutput::Lsn;
use super::sql::describe;
use super::{open, PgConn, PgConnect, PgTarget, BACKOFF_FIRST, CLIENT_GRACE};
use crate::protocol::Rejection;

/// How long a replica found behind the node's floor (or cancelled by a recovery
/// conflict) is passed over by every thread: a paused or slow replica costs a wasted
/// round trip once per this, not on every miss.
const BEHIND_SKIP: Duration = Duration::from_millis(100);

/// How long a replica whose search timed out (on the server or here), or failed, or
/// whose connection was lost, is passed over by every thread: a slow replica delays
/// one miss (by at most its attempt's bound) once per this.
const FAILED_SKIP: Duration = Duration::from_secs(1);

/// A replica attempt's share of the time: at most this part of `statement_timeout`
/// and of what the request's deadline leaves, the rest kept for the primary.
const ATTEMPT_SHARE: u32 = 2;

/// The shortest replica attempt worth making; with less time left, the primary.
const ATTEMPT_MIN: Duration = Duration::from_millis(2);

/// How long an idle backend thread lets a replica connection being opened progress at
/// a time (a request arriving meanwhile waits at most this).
const IDLE_DRIVE: Duration = Duration::from_millis(1);

/// The replay position, NULL on a server not in recovery (a promoted replica, or a
/// primary named by mistake): such a server never vouches for an answer.
const REPLAY_POSITION: &str =
    "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() END";

/// Counters of the read replicas, for STATS and /metrics.
#[derive(Default)]
pub(crate) struct ReplicaStats {
    /// Misses a replica answered.
    pub searches: AtomicU64,
    /// Answers discarded: the replica had not replayed the floor (or was not in
    /// recovery).
    pub behind: AtomicU64,
    /// Searches cancelled by a recovery conflict, then run on the primary.
    pub conflicts: AtomicU64,
    /// Searches that timed out, were cancelled, failed or lost their connection, then
    /// run on the primary (the replica passed over for FAILED_SKIP).
    pub failed: AtomicU64,
    /// The last measured `applied - replayed` (0 when the replica was ahead).
    pub lag_bytes: AtomicU64,
    /// Replica connections up, over every backend thread.
    pub up: AtomicU64,
}

/// One replica, as every backend thread shares it.
struct Replica {
    conn: PgConnect,
    /// As configured (no password: refused there), for the log.
    url: String,
    /// Passed over until this instant (µs since `Replicas::epoch`).
    skip_until_us: AtomicU64,
}

/// The primary's read replicas and what decides whether one may answer a miss.
pub(crate) struct Replicas {
    list: Vec<Replica>,
    /// Round robin over the replicas, shared by the threads.
    next: AtomicUsize,
    /// The highest WAL position read after a write through akerd committed: the
    /// stream may not have applied it yet (a write it timed out on, or made while it
    /// reconnected), but the cache has dropped the id and the primary holds the write.
    written: AtomicU64,
    /// Writes through akerd whose position is unknown (in doubt, or unread), counted;
    /// `resolved`: how many of them `written` covers (a later read of the primary's
    /// WAL position).
    unknown: AtomicU64,
    resolved: AtomicU64,
    epoch: Instant,
    pub(crate) stats: ReplicaStats,
}

impl Replicas {
    /// `urls`: each replica's url, as configured, and how to reach it.
    pub(crate) fn new(urls: Vec<(String, PgConnect)>) -> Replicas {
        Replicas {
            list: urls
                .into_iter()
                .map(|(url, conn)| Replica {
                    conn,
                    url,
                    skip_until_us: AtomicU64::new(0),
                })
                .collect(),
            next: AtomicUsize::new(0),
            written: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
            resolved: AtomicU64::new(0),
            epoch: Instant::now(),
            stats: ReplicaStats::default(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// A write through akerd committed, with the WAL position after its COMMIT when it
    /// could be read; called before the write reaches the cache (or its id leaves it).
    pub(super) fn wrote(&self, at: Option<Lsn>) {
        match at {
            Some(at) => {
                self.written.fetch_max(at, Ordering::AcqRel);
            }
            None => self.position_unknown(),
        }
    }

    /// A write through akerd may have committed at a position not known: no replica
    /// answers until the primary's WAL position has been read since.
    pub(super) fn position_unknown(&self) {
        self.unknown.fetch_add(1, Ordering::AcqRel);
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn passed_over(&self, i: usize) -> bool {
        self.now_us() < self.list[i].skip_until_us.load(Ordering::Relaxed)
    }

    fn pass_over(&self, i: usize, d: Duration) {
        let until = self.now_us() + d.as_micros() as u64;
        self.list[i]
            .skip_until_us
            .fetch_max(until, Ordering::Relaxed);
    }

    /// The positions a replica must have replayed to answer a miss (see the module's
    /// notes); `None`: only the primary may answer now.
    fn floor(&self, feed: &ChangeFeed, at: Option<Lsn>, pg: &mut PgConn) -> Option<Floor> {
        if !feed.following() || feed.past_staleness() {
            return None;
        }
        let unknown = self.unknown.load(Ordering::Acquire);
        if unknown > self.resolved.load(Ordering::Acquire) {
            // Read after those writes settled: at or past wherever they committed.
            let now = pg.wal_insert_position()?;
            self.written.fetch_max(now, Ordering::AcqRel);
            self.resolved.fetch_max(unknown, Ordering::AcqRel);
        }
        let written = self.written.load(Ordering::Acquire);
        let node = feed.applied().max(written);
        Some(Floor {
            node,
            request: node.max(at.unwrap_or(0)),
        })
    }
}

/// What a replica must have replayed for its answer to be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Floor {
    /// What this node holds: the stream's applied position, akerd's own writes. A
    /// replica behind it is passed over by every thread for a while.
    node: Lsn,
    /// `node`, or the request's AT_POSITION where higher: a replica behind only this
    /// sends just this request to the primary.
    request: Lsn,
}

/// What a replica's answer came to, given the floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Replayed the request's floor: served.
    Serve,
    /// Behind the request's position only: this request on the primary.
    BehindRequest,
    /// Behind the node's floor: passed over for [`BEHIND_SKIP`].
    BehindNode,
    /// Not in recovery (promoted, or a primary): passed over for `reconnect_ms_max`.
    NotInRecovery,
}

impl Floor {
    fn verdict(self, replayed: Option<Lsn>) -> Verdict {
        match replayed {
            None => Verdict::NotInRecovery,
            Some(at) if at < self.node => Verdict::BehindNode,
            Some(at) if at < self.request => Verdict::BehindRequest,
            Some(_) => Verdict::Serve,
        }
    }
}

/// A replica attempt's bounds from what the primary's search would have (`timeout`:
/// `statement_timeout`, or what the deadline leaves where less): the attempt's
/// `statement_timeout` on the replica, and how long this side waits for its answer (a
/// [`ATTEMPT_SHARE`]th of `timeout`; the server's a quarter shorter, so that the
/// server's cancel, which keeps the connection, comes first). `None`: too little time.
fn attempt_bounds(timeout: Duration) -> Option<(Duration, Duration)> {
    let wait = timeout / ATTEMPT_SHARE;
    (wait >= ATTEMPT_MIN).then(|| (wait - wait / 4, wait))
}

/// A replica connection of one backend thread and its prepared statements.
struct Standby {
    client: Client,
    check: Statement,
    /// Search statements by limit, prepared on first use (as on the primary).
    search: HashMap<usize, Statement>,
}

/// What opening a replica connection gives (the error as text: it crosses a task).
type Opened = Result<Standby, String>;

enum Link {
    /// No connection; the next attempt not before this instant.
    Down(Instant),
    Opening(JoinHandle<Opened>),
    Up(Standby),
}

/// One thread's link to one replica, with its backoff.
struct Slot {
    link: Link,
    pause: Duration,
    /// An attempt failed or the connection was lost since it was last up (logged once).
    in_trouble: bool,
}

/// What a search on a replica came to.
enum Ran {
    /// The replay position it read (`None`: not in recovery) and the rows.
    Rows(Option<Lsn>, Vec<Row>),
    /// Cancelled by a recovery conflict.
    Conflict,
    /// Lost, stale, timed out (on the server or here), or another error: the primary
    /// answers.
    Failed,
}

/// The check, then the search, in one pipelined transaction (`conn::send`).
struct Checked<'a> {
    check: &'a Statement,
    query: &'a Vector,
}

impl Piped for Checked<'_> {
    type Out = (Option<Lsn>, Vec<Row>);

    async fn run(&self, c: &Client, st: &Statement) -> Result<Self::Out, tokio_postgres::Error> {
        let params: [&(dyn ToSql + Sync); 1] = [self.query];
        // In this order on the wire: the search's snapshot is taken after the check.
        let (check, rows) = tokio::join!(
            biased;
            c.query_one(self.check, &[]),
            c.query(st, &params)
        );
        let replayed = check?.get::<_, Option<PgLsn>>(0).map(u64::from);
        Ok((replayed, rows?))
    }
}

/// Opens a replica connection and prepares its check, bounded like the primary's. The
/// check is prepared inside a READ COMMITTED transaction: preparing a SELECT takes a
/// snapshot, which a `default_transaction_isolation = serializable` refuses on a
/// standby (every search sets its level itself).
async fn open_standby(conn: PgConnect, bound: Duration) -> Opened {
    let work = async {
        let client = open(&conn).await?;
        let (a, check, b) = tokio::join!(
            biased;
            client.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED"),
            client.prepare(REPLAY_POSITION),
            client.batch_execute("COMMIT")
        );
        a?;
        let check = check?;
        b?;
        Ok::<_, tokio_postgres::Error>(Standby {
            client,
            check,
            search: HashMap::new(),
        })
    };
    match tokio::time::timeout(bound, work).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(describe(&e)),
        Err(_) => Err("no connection within the connect and statement timeouts".into()),
    }
}

/// A recovery conflict: the statement (40001) or the session (40001, or 57P04 for a
/// database dropped) ended so that replay could go on.
fn recovery_conflict(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::DATABASE_DROPPED
    })
}

/// One backend thread's replica connections.
pub(crate) struct Standbys {
    target: Arc<PgTarget>,
    slots: Vec<Slot>,
}

impl Standbys {
    /// Starts opening a connection to every replica (on `rt`, in the background).
    pub(crate) fn new(target: Arc<PgTarget>, rt: &Runtime) -> Standbys {
        let slots = (0..target.replicas.len())
            .map(|_| Slot {
                link: Link::Down(Instant::now()),
                pause: BACKOFF_FIRST,
                in_trouble: false,
            })
            .collect();
        let mut s = Standbys { target, slots };
        s.tend(rt);
        s
    }

    /// Takes the connection attempts that have finished and starts those due; never
    /// waits on one.
    fn tend(&mut self, rt: &Runtime) {
        for i in 0..self.slots.len() {
            let link = std::mem::replace(&mut self.slots[i].link, Link::Down(Instant::now()));
            self.slots[i].link = match link {
                Link::Opening(mut h) if h.is_finished() => {
                    let got = rt
                        .block_on(&mut h)
                        .unwrap_or_else(|e| Err(format!("connection task: {e}")));
                    self.opened(i, got)
                }
                Link::Down(at) if Instant::now() >= at => {
                    // Bounded as the primary's: the connect, then the preparation.
                    let t = &*self.target;
                    let conn = t.replicas.list[i].conn.clone();
                    let connect = conn.config.get_connect_timeout().copied();
                    let bound = connect.unwrap_or(CLIENT_GRACE) + t.statement_timeout;
                    Link::Opening(rt.spawn(open_standby(conn, bound)))
                }
                other => other,
            };
        }
    }

    /// The link after an attempt: up, or down with the backoff doubled.
    fn opened(&mut self, i: usize, got: Opened) -> Link {
        let (t, s) = (&*self.target, &mut self.slots[i]);
        let url = &t.replicas.list[i].url;
        match got {
            Ok(standby) => {
                t.replicas.stats.up.fetch_add(1, Ordering::Relaxed);
                if s.in_trouble {
                    tracing::info!(replica = %url, "pgvector: replica connection restored");
                }
                (s.pause, s.in_trouble) = (BACKOFF_FIRST, false);
                Link::Up(standby)
            }
            Err(why) => {
                if !s.in_trouble {
                    tracing::warn!(replica = %url, error = %why,
                        "pgvector: cannot connect to a replica; misses go to the primary");
                }
                let next = Instant::now() + s.pause;
                (s.pause, s.in_trouble) = ((s.pause * 2).min(t.reconnect_max), true);
                Link::Down(next)
            }
        }
    }

    /// Drops replica `i`'s connection; another is opened at once, in the background.
    fn lost(&mut self, i: usize, why: &str) {
        let s = &mut self.slots[i];
        if let Link::Up(_) = std::mem::replace(&mut s.link, Link::Down(Instant::now())) {
            self.target
                .replicas
                .stats
                .up
                .fetch_sub(1, Ordering::Relaxed);
            if !s.in_trouble {
                tracing::warn!(replica = %self.target.replicas.list[i].url, error = why,
                    "pgvector: replica connection lost; misses go to the primary meanwhile");
            }
            s.in_trouble = true;
        }
    }

    /// An idle thread: due attempts started, and those under way given a moment.
    pub(crate) fn idle(&mut self, rt: &Runtime) {
        self.tend(rt);
        if self
            .slots
            .iter()
            .any(|s| matches!(s.link, Link::Opening(_)))
        {
            // Made inside the runtime: a timer needs its context.
            rt.block_on(async { tokio::time::sleep(IDLE_DRIVE).await });
        }
    }

    /// The next replica in turn that this thread is connected to and that is not
    /// passed over.
    fn pick(&self) -> Option<usize> {
        let r = &self.target.replicas;
        let n = self.slots.len();
        let start = r.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| matches!(self.slots[i].link, Link::Up(_)) && !r.passed_over(i))
    }

    /// A miss on a replica that may answer it: `Ok(None)` when none may, none could,
    /// or its answer was discarded (the primary answers then).
    fn try_search(
        &mut self,
        pg: &mut PgConn,
        q: &[f32],
        n: usize,
        deadline: Option<Instant>,
        at_position: Option<Lsn>,
    ) -> Result<Option<PgAnswer>, Rejection> {
        if self.slots.is_empty() {
            return Ok(None);
        }
        self.tend(&pg.rt);
        let Some(i) = self.pick() else {
            return Ok(None);
        };
        let t = self.target.clone();
        let Some(floor) = t.replicas.floor(&t.changes, at_position, pg) else {
            return Ok(None);
        };
        let timeout = pg.timeout_for(deadline).ok_or_else(deadline_exceeded)?;
        let Some((server, wait)) = attempt_bounds(timeout) else {
            return Ok(None);
        };
        let query = Vector::from(q.to_vec());
        match self.run(&pg.rt, i, &query, n, server, wait) {
            Ran::Rows(replayed, rows) => {
                Ok(self.judge(i, floor, replayed).then(|| pg.answer(rows, n)))
            }
            Ran::Conflict => {
                t.replicas.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                t.replicas.pass_over(i, BEHIND_SKIP);
                Ok(None)
            }
            Ran::Failed => {
                t.replicas.stats.failed.fetch_add(1, Ordering::Relaxed);
                t.replicas.pass_over(i, FAILED_SKIP);
                Ok(None)
            }
        }
    }

    /// Whether replica `i`'s answer may be served: it had replayed the request's floor
    /// before the search's snapshot. Behind the node's floor (or not in recovery), it
    /// is passed over for a while; behind only the request's position, it is not.
    fn judge(&self, i: usize, floor: Floor, replayed: Option<Lsn>) -> bool {
        let (t, r) = (&*self.target, &self.target.replicas);
        if let Some(at) = replayed {
            let lag_bytes = t.changes.applied().saturating_sub(at);
            r.stats.lag_bytes.store(lag_bytes, Ordering::Relaxed);
        }
        let verdict = floor.verdict(replayed);
        if verdict == Verdict::Serve {
            r.stats.searches.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        r.stats.behind.fetch_add(1, Ordering::Relaxed);
        match verdict {
            Verdict::NotInRecovery => {
                tracing::warn!(replica = %r.list[i].url,
                    "pgvector: a replica_urls server is not in recovery (promoted, or not a \
                     replica): passed over");
                r.pass_over(i, t.reconnect_max);
            }
            Verdict::BehindNode => r.pass_over(i, BEHIND_SKIP),
            Verdict::BehindRequest | Verdict::Serve => {}
        }
        false
    }

    /// The check and the search on replica `i`, one round trip (one more when the
    /// limit `n` is not prepared on this connection yet), under the `server`'s
    /// statement_timeout, its answer awaited for at most `wait` (`attempt_bounds`).
    fn run(
        &mut self,
        rt: &Runtime,
        i: usize,
        query: &Vector,
        n: usize,
        server: Duration,
        wait: Duration,
    ) -> Ran {
        let t = self.target.clone();
        let Link::Up(sb) = &mut self.slots[i].link else {
            return Ran::Failed;
        };
        if sb.client.is_closed() {
            self.lost(i, "connection closed");
            return Ran::Failed;
        }
        let prelude = format!("{}{}", t.search_prelude, server.as_millis().max(1));
        let statement = sb.search.get(&n).cloned().ok_or_else(|| t.sql.search(n));
        let stmt = Checked {
            check: &sb.check,
            query,
        };
        let mut prep = Prepared::default();
        let r = rt.block_on(async {
            let work = send(&sb.client, &prelude, server, statement, &stmt, &mut prep);
            tokio::time::timeout(wait, work).await
        });
        if let Some(st) = prep.statement {
            sb.search.insert(n, st);
        }
        if prep.rollback_failed {
            self.lost(i, "ROLLBACK after a failed PREPARE");
        }
        match r {
            Ok(Ok(((replayed, rows), _))) => Ran::Rows(replayed, rows),
            Ok(Err(e)) => self.failed(i, &e),
            Err(_) => {
                // Its state unknown: not reused.
                self.lost(i, "no answer within the replica attempt's time");
                Ran::Failed
            }
        }
    }

    /// A search the replica answered with an error (or lost the connection on).
    fn failed(&mut self, i: usize, e: &tokio_postgres::Error) -> Ran {
        let why = describe(e);
        if connection_gone(e) || stale_statement(e) {
            self.lost(i, &why);
        }
        if recovery_conflict(e) {
            tracing::debug!(error = %why, "pgvector: replica search cancelled by recovery; on the primary");
            return Ran::Conflict;
        }
        if e.code() == Some(&SqlState::QUERY_CANCELED) {
            tracing::debug!(error = %why,
                "pgvector: replica search cancelled (its share of the time); on the primary");
            return Ran::Failed;
        }
        tracing::debug!(error = %why, "pgvector: replica search failed; on the primary");
        Ran::Failed
    }
}

impl Drop for Standbys {
    fn drop(&mut self) {
        for s in &self.slots {
            if let Link::Up(_) = s.link {
                self.target
                    .replicas
                    .stats
                    .up
                    .fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// A backend search: on a replica where one may answer (see the module's notes), else,
/// or after a replica could not, on the primary.
pub(crate) fn search(
    pg: &mut PgConn,
    standbys: &mut Standbys,
    q: &[f32],
    n: usize,
    deadline: Option<Instant>,
    at_position: Option<Lsn>,
) -> Result<PgAnswer, Rejection> {
    if let Some(answer) = standbys.try_search(pg, q, n, deadline, at_position)? {
        return Ok(answer);
    }
    pg.search(q, n, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_nodes_floor_passes_a_replica_over() {
        let f = Floor {
            node: 100,
            request: 500,
        };
        assert_eq!(f.verdict(None), Verdict::NotInRecovery);
        assert_eq!(f.verdict(Some(99)), Verdict::BehindNode);
        assert_eq!(f.verdict(Some(100)), Verdict::BehindRequest);
        assert_eq!(f.verdict(Some(499)), Verdict::BehindRequest);
        assert_eq!(f.verdict(Some(500)), Verdict::Serve);
        // A bogus position far ahead: that request only.
        let bogus = Floor {
            node: 100,
            request: u64::MAX,
        };
        assert_eq!(bogus.verdict(Some(1_000)), Verdict::BehindRequest);
        let none = Floor {
            node: 100,
            request: 100,
        };
        assert_eq!(none.verdict(Some(100)), Verdict::Serve);
    }

    #[test]
    fn a_replica_attempt_leaves_the_primary_at_least_as_much() {
        let ms = Duration::from_millis;
        let (server, wait) = attempt_bounds(ms(5_000)).unwrap();
        assert_eq!(wait, ms(2_500));
        assert!(server < wait, "{server:?} {wait:?}");
        assert_eq!(server, ms(1_875));
        let (server, wait) = attempt_bounds(ms(40)).unwrap();
        assert_eq!((server, wait), (ms(15), ms(20)));
        assert!(attempt_bounds(ms(3)).is_none());
    }
}
