//! The follower's loop: read the flush position, peek the slot's changes up to it, apply
//! them to the shard owners, publish the applied position, advance the slot.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_lite::StreamExt;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

use super::super::pgoutput::{self, lsn_text, Lsn, Message};
use super::super::{open, runtime, PgConnect, PgTarget, BACKOFF_FIRST};
use super::decode::{Change, Decoder, Kind};
use super::setup::{self, SetupError, SlotFound};
use super::{ChangeFeed, FeedState, FollowParts, Snap};
use crate::config::PgvectorSection;

/// Changes read per poll (a transaction is never split: one larger arrives whole, and
/// is applied row by row as it streams in).
const CHANGES_PER_POLL: i32 = 8192;
/// Owner acknowledgements awaited every this many changes (bounds akerd's memory
/// while applying a large transaction).
const ACKS_MAX: usize = 1024;
/// The slot's confirmed position is advanced at most this often (advancing decodes).
const ADVANCE_EVERY: Duration = Duration::from_millis(200);
/// The table, the slot's state and its retained WAL are checked this often.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// How often a wait for an owner's acknowledgement looks whether akerd is stopping.
const ACK_STOP_CHECK: Duration = Duration::from_millis(50);
/// How long one transaction may stay invisible to new snapshots before it is logged.
const VISIBLE_WARN: Duration = Duration::from_secs(5);
/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const PG_EPOCH_US: i64 = 946_684_800_000_000;

/// The follower's settings, from the config.
pub(super) struct FollowConfig {
    slot: String,
    poll: Duration,
    id_column: String,
    vector_column: String,
}

impl FollowConfig {
    pub(super) fn new(section: &PgvectorSection, instance: &str) -> FollowConfig {
        FollowConfig {
            slot: super::slot_name(instance),
            poll: Duration::from_millis(section.changes_poll_ms),
            id_column: section.id_column.clone(),
            vector_column: section.vector_column.clone(),
        }
    }
}

/// The follower's sessions: no statement runs longer than this (a read that would is a
/// lost connection, read again after a reconnection), and no idle transaction is left.
const SESSION_SETTINGS: &str =
    "SET statement_timeout = '60s'; SET idle_in_transaction_session_timeout = '60s'";
/// Asked of the server on each follower session, best effort (PostgreSQL needs POLLRDHUP
/// for it): a peek of an akerd killed mid-read ends within a second instead of holding
/// the slot to its end, so the akerd started again finds the slot free
/// (`setup::wait_slot_inactive`).
pub(super) const CLIENT_CHECK: &str = "SET client_connection_check_interval = '1s'";
// (setup.rs puts the same statement_timeout back after its longer statements.)

/// The pool's connection settings with TCP keepalives and a user timeout, so that a
/// silent network is found in seconds, not the system's two hours.
fn follower_conn(target: &PgTarget) -> PgConnect {
    let mut c = target.conn.clone();
    c.config
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .keepalives_interval(Duration::from_secs(5))
        .keepalives_retries(3)
        .tcp_user_timeout(Duration::from_secs(30));
    c
}

/// Why a poll stopped.
enum PollError {
    /// The connection is gone: reconnect and resume from the slot.
    Lost(String),
    /// The slot is gone or can no longer be read: a cold start.
    SlotLost(String),
    /// The table is not the one akerd started on: stop following.
    TableChanged(String),
    /// The shard owners have stopped (akerd is stopping).
    OwnersGone,
}

impl From<tokio_postgres::Error> for PollError {
    fn from(e: tokio_postgres::Error) -> Self {
        let msg = setup::db_message(&e);
        let slot_gone = e.code().is_some_and(|c| {
            matches!(c.code(), "42704" | "55000") // undefined_object, object_not_in_prerequisite_state
        });
        if slot_gone && msg.contains("slot") {
            PollError::SlotLost(msg)
        } else {
            PollError::Lost(msg)
        }
    }
}

struct Follower {
    target: Arc<PgTarget>,
    cfg: FollowConfig,
    parts: FollowParts,
    ctl: Client,
    stream: Client,
    decoder: Decoder,
    /// The read's statement, prepared once on `stream`.
    peek: Option<tokio_postgres::Statement>,
    /// The changes of the message being applied (reused).
    changes: Vec<Change>,
    snap: Snap,
    /// Acks of changes queued since the last wait.
    insert_acks: super::super::super::backend::InsertAcks,
    delete_acks: super::super::super::backend::DeleteAcks,
    /// The slot's confirmed position, as last advanced.
    confirmed: Lsn,
    advanced_at: Instant,
    /// Whether `pg_log_standby_snapshot()` may be called (see `log_running_xacts`).
    log_xacts: bool,
    /// Transactions applied when the last running-transactions record was written.
    commits_logged: u64,
    checked_at: Instant,
    /// The owners run (their executors started): flushes await their acks. At start
    /// they do not yet, and a flush is queued ahead of any request instead.
    serving: bool,
}

/// The follower thread: setup (answered on `setup_tx`), then the loop until `stop`.
pub(super) fn run(
    target: Arc<PgTarget>,
    cfg: FollowConfig,
    parts: FollowParts,
    setup_tx: flume::Sender<Result<(), SetupError>>,
) {
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = setup_tx.send(Err(SetupError::Other(format!("no runtime: {e}"))));
            return;
        }
    };
    // However the thread ends (stopping, a table that changed, a panic), writes through
    // akerd stop waiting for it.
    let _stopped = StopOnExit(target.clone());
    rt.block_on(async move {
        let mut f = match Follower::start(target, cfg, parts).await {
            Ok(f) => f,
            Err(e) => {
                let _ = setup_tx.send(Err(e));
                return;
            }
        };
        if setup_tx.send(Ok(())).is_err() {
            // Start-up gave up waiting for this setup (and said so): nothing follows.
            return;
        }
        f.serving = true;
        f.follow().await;
    });
}

/// Marks the stream stopped when the follower thread ends.
struct StopOnExit(Arc<PgTarget>);

impl Drop for StopOnExit {
    fn drop(&mut self) {
        let feed = &self.0.changes;
        if feed.following() {
            feed.set_following(false, FeedState::Stopped);
        }
    }
}

impl Follower {
    /// Connects, checks, locks, makes the publication and the slot, and starts cold.
    async fn start(
        target: Arc<PgTarget>,
        cfg: FollowConfig,
        parts: FollowParts,
    ) -> Result<Follower, SetupError> {
        let (ctl, stream, relid) = Follower::connect(&target, &cfg).await?;
        let mut f = Follower {
            decoder: Decoder::new(relid, target.dim, &cfg.id_column, &cfg.vector_column),
            target,
            cfg,
            parts,
            ctl,
            stream,
            peek: None,
            changes: Vec::new(),
            snap: Snap::default(),
            insert_acks: Vec::new(),
            delete_acks: Vec::new(),
            confirmed: 0,
            advanced_at: Instant::now(),
            log_xacts: true,
            commits_logged: 0,
            checked_at: Instant::now(),
            serving: false,
        };
        let cold = !f.feed().is_warm();
        f.slot_ready(cold).await?;
        if !cold {
            tracing::info!(applied = %lsn_text(f.feed().applied()),
                "pgvector: the change stream resumes after the restored snapshot");
        }
        Ok(f)
    }

    fn feed(&self) -> &ChangeFeed {
        &self.target.changes
    }

    async fn connect(
        target: &PgTarget,
        cfg: &FollowConfig,
    ) -> Result<(Client, Client, u32), SetupError> {
        let conn = follower_conn(target);
        let ctl = open(&conn).await?;
        ctl.batch_execute(SESSION_SETTINGS).await?;
        let _ = ctl.batch_execute(CLIENT_CHECK).await;
        setup::check_server(&ctl).await?;
        let relid = setup::check_table(&ctl, &target.table, &cfg.id_column).await?;
        setup::lock(&ctl, &cfg.slot).await?;
        setup::publication(&ctl, &cfg.slot, &target.table).await?;
        let stream = open(&conn).await?;
        stream.batch_execute(SESSION_SETTINGS).await?;
        let _ = stream.batch_execute(CLIENT_CHECK).await;
        Ok((ctl, stream, relid))
    }

    /// The slot made or checked. `cold`: the cache is empty (start), so the stream
    /// starts at the flush position; otherwise a usable slot resumes where it was, and
    /// a new one (the old gone or invalidated) starts there too, the cache flushed once
    /// that position is fixed and visible (misses in flight across the flush are not
    /// admitted: the flush cuts their tickets off).
    async fn slot_ready(&mut self, cold: bool) -> Result<(), SetupError> {
        let found = setup::slot(&self.ctl, &self.cfg.slot).await?;
        if found == SlotFound::Usable && !cold {
            self.feed().set_following(true, FeedState::Following);
            return Ok(());
        }
        match &found {
            SlotFound::Remade(why) => tracing::error!(slot = %self.cfg.slot, reason = %why,
                "pgvector: the slot was invalidated: its changes since are lost; the cache \
                 is flushed and the slot made anew"),
            SlotFound::Made if !cold => tracing::error!(slot = %self.cfg.slot,
                "pgvector: the slot is gone: the cache is flushed and the slot made anew"),
            _ => {}
        }
        if !cold {
            self.feed().stats.slot_lost.fetch_add(1, Ordering::Relaxed);
        }
        let at = setup::cold_start(&self.ctl, &self.cfg.slot).await?;
        if !cold {
            self.flush()
                .await
                .map_err(|_| SetupError::Other("owners stopped".into()))?;
        }
        self.confirmed = at;
        // A new slot's positions may lie before the old applied one (a failover, a
        // restore): the applied position is set, not raised.
        self.feed().reset_applied(at);
        self.feed().set_following(true, FeedState::Following);
        Ok(())
    }

    /// Polls until stopped; reconnects when the database goes away.
    async fn follow(&mut self) {
        let wake = self.target.changes.wake_rx.clone();
        loop {
            if self.parts.stop.load(Ordering::Acquire) {
                return;
            }
            let _ = tokio::time::timeout(self.cfg.poll, wake.recv_async()).await;
            let r = match self.poll().await {
                Ok(()) => {
                    self.exports();
                    self.housekeeping().await
                }
                Err(e) => Err(e),
            };
            match r {
                Ok(()) => {}
                Err(PollError::Lost(why)) => {
                    if !self.reconnect(&why).await {
                        return;
                    }
                }
                Err(PollError::SlotLost(why)) => {
                    // Counted once remade (`slot_ready`).
                    tracing::error!(slot = %self.cfg.slot, reason = %why, "pgvector: the slot can no longer be read");
                    let remade = async {
                        let _ = self.ctl.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", &[&self.cfg.slot]).await;
                        self.slot_ready(false).await
                    };
                    if let Err(e) = remade.await {
                        if !self.reconnect(&e.to_string()).await {
                            return;
                        }
                    }
                }
                Err(PollError::TableChanged(why)) => {
                    tracing::error!(table = %self.target.table, reason = %why,
                        "pgvector: the table changed under akerd: the cache is flushed and akerd \
                         STOPS following its changes (restart akerd to follow the new table)");
                    let _ = self.flush().await;
                    self.feed().set_following(false, FeedState::Stopped);
                    return;
                }
                Err(PollError::OwnersGone) => return,
            }
        }
    }

    /// One read of the stream up to the flush position.
    async fn poll(&mut self) -> Result<(), PollError> {
        let target = self.target.clone();
        let stats = &target.changes.stats;
        stats.polls.fetch_add(1, Ordering::Relaxed);
        let began_us = self.feed().now_us();
        let (upto, snap) = setup::position(&self.ctl).await?;
        self.snap = snap;
        let applied = self.feed().applied();
        stats
            .lag_bytes
            .store(upto.saturating_sub(applied), Ordering::Relaxed);
        if upto <= applied {
            stats.lag_ms.store(0, Ordering::Relaxed);
            self.feed().caught_up(began_us);
            return Ok(());
        }
        let mut limit = Some(CHANGES_PER_POLL);
        let (rows, last_end) = loop {
            let (rows, last_end) = self.read(upto, applied, limit).await?;
            let limited = limit.is_some_and(|l| rows >= l as usize);
            // A limited read of transactions all applied before (the slot held back at
            // shutdown, or resumed behind after a reconnection) moves nothing: read on.
            if limited && last_end.is_none_or(|e| e <= applied) {
                limit = None;
                continue;
            }
            break (if limited { Some(rows) } else { None }, last_end);
        };
        self.await_acks().await?;
        let to = match rows {
            // Cut at the limit: applied through the last whole transaction read.
            Some(_) => last_end.unwrap_or(applied),
            None => upto.max(last_end.unwrap_or(0)),
        };
        if last_end.is_none() {
            stats.lag_ms.store(0, Ordering::Relaxed);
        }
        self.feed().advance(to);
        if to >= upto {
            self.feed().caught_up(began_us);
        }
        stats
            .lag_bytes
            .store(upto.saturating_sub(to), Ordering::Relaxed);
        Ok(())
    }

    /// Streams the slot's changes up to `upto`, applying each; the rows read and the
    /// end of the last commit.
    async fn read(
        &mut self,
        upto: Lsn,
        applied: Lsn,
        limit: Option<i32>,
    ) -> Result<(usize, Option<Lsn>), PollError> {
        let slot = self.cfg.slot.clone();
        let st = match &self.peek {
            Some(st) => st.clone(),
            None => {
                let st = self
                    .stream
                    .prepare(
                        "SELECT data FROM pg_logical_slot_peek_binary_changes($1::text::name, \
                         $2, $3, 'proto_version', '1', 'publication_names', $4::text)",
                    )
                    .await?;
                self.peek = Some(st.clone());
                st
            }
        };
        let upto_lsn = PgLsn::from(upto);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&slot, &upto_lsn, &limit, &slot];
        let rows = self.stream.query_raw(&st, params).await?;
        let mut rows = std::pin::pin!(rows);
        let (mut n, mut last_end, mut skip) = (0usize, None, false);
        while let Some(row) = rows.next().await {
            let row = row?;
            n += 1;
            let data: &[u8] = row.get(0);
            let msg = pgoutput::decode(data)
                .map_err(|e| PollError::TableChanged(format!("a change akerd cannot read: {e}")))?;
            match msg {
                Message::Begin { final_lsn, xid, .. } => {
                    // Already applied before a reconnection: the slot resumes from its
                    // confirmed position, which may be behind.
                    skip = final_lsn < applied;
                    if !skip {
                        self.until_visible(xid).await?;
                    }
                }
                Message::Commit {
                    end_lsn,
                    commit_ts_us,
                    ..
                } => {
                    last_end = Some(end_lsn);
                    if !skip {
                        self.committed(commit_ts_us);
                    }
                    skip = false;
                }
                Message::Relation(r) => {
                    self.decoder.relation(&r).map_err(PollError::TableChanged)?
                }
                _ if skip => {}
                m => self.apply(m).await?,
            }
            if self.insert_acks.len() + self.delete_acks.len()
                >= ACKS_MAX * self.parts.owners.len().max(1)
            {
                self.await_acks().await?;
            }
        }
        Ok((n, last_end))
    }

    /// Waits until a snapshot taken now sees transaction `xid` (decoded, so committed).
    async fn until_visible(&mut self, xid: u32) -> Result<(), PollError> {
        let since = Instant::now();
        let mut warned = false;
        loop {
            let x = self.snap.widen(xid);
            if self.snap.sees(x) {
                return Ok(());
            }
            if !warned && since.elapsed() > VISIBLE_WARN {
                warned = true;
                tracing::warn!(xid, "pgvector: a decoded transaction is still not visible");
            }
            if self.parts.stop.load(Ordering::Acquire) {
                return Err(PollError::OwnersGone);
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
            self.snap = setup::position(&self.ctl).await?.1;
        }
    }

    fn committed(&self, commit_ts_us: i64) {
        let stats = &self.target.changes.stats;
        stats.commits.fetch_add(1, Ordering::Relaxed);
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64)
            - PG_EPOCH_US;
        let lag_ms = (now_us - commit_ts_us).max(0) / 1000;
        stats.lag_ms.store(lag_ms as u64, Ordering::Relaxed);
    }

    /// One change, as akerd's own writes are applied.
    async fn apply(&mut self, m: Message<'_>) -> Result<(), PollError> {
        let mut changes = std::mem::take(&mut self.changes);
        changes.clear();
        let kind = self
            .decoder
            .changes(&m, &mut changes)
            .map_err(PollError::TableChanged)?;
        let stats = &self.target.changes.stats;
        let counter = match kind {
            None => None,
            Some(Kind::Insert) => Some(&stats.inserts),
            Some(Kind::Update) => Some(&stats.updates),
            Some(Kind::PartialUpdate) => {
                stats.updates.fetch_add(1, Ordering::Relaxed);
                Some(&stats.updates_partial)
            }
            Some(Kind::Delete) => Some(&stats.deletes),
            Some(Kind::Truncate) => Some(&stats.truncates),
        };
        if let Some(c) = counter {
            c.fetch_add(1, Ordering::Relaxed);
        }
        for c in changes.drain(..) {
            match c {
                Change::Upsert { id, vector } => {
                    // An update's old vector is not in the stream: out first, then in.
                    if kind != Some(Kind::Insert) {
                        self.delete(id)?;
                    }
                    self.upsert(id, vector)?;
                }
                Change::Delete { id } => self.delete(id)?,
                Change::Flush => {
                    self.await_acks().await?;
                    self.flush().await?;
                }
            }
        }
        self.changes = changes;
        Ok(())
    }

    /// A row into the cache through the refresh path.
    fn upsert(&mut self, id: u64, vector: Vec<f32>) -> Result<(), PollError> {
        let vector: Arc<[f32]> = vector.into();
        let near = self.parts.router.route_write(&vector);
        let acks = self
            .parts
            .owners
            .queue_insert(id, &vector, near)
            .map_err(|_| PollError::OwnersGone)?;
        self.insert_acks.extend(acks);
        Ok(())
    }

    fn delete(&mut self, id: u64) -> Result<(), PollError> {
        let acks = self
            .parts
            .owners
            .queue_delete(id)
            .map_err(|_| PollError::OwnersGone)?;
        self.delete_acks.extend(acks);
        Ok(())
    }

    async fn await_acks(&mut self) -> Result<(), PollError> {
        for a in std::mem::take(&mut self.insert_acks) {
            self.ack(a).await?.ok();
        }
        for a in std::mem::take(&mut self.delete_acks) {
            self.ack(a).await?;
        }
        Ok(())
    }

    /// An owner's acknowledgement; `OwnersGone` once akerd is stopping. A message queued
    /// to an owner whose executor has stopped is never answered, and its reply channel
    /// never closes either (the queue keeps it while any sender of the queue lives), so
    /// a plain wait would hold the shutdown that joins this thread forever.
    async fn ack<T>(&self, a: flume::Receiver<T>) -> Result<T, PollError> {
        loop {
            match tokio::time::timeout(ACK_STOP_CHECK, a.recv_async()).await {
                Ok(r) => return r.map_err(|_| PollError::OwnersGone),
                Err(_) if self.parts.stop.load(Ordering::Acquire) => {
                    return Err(PollError::OwnersGone)
                }
                Err(_) => {}
            }
        }
    }

    async fn flush(&mut self) -> Result<(), PollError> {
        let acks = self
            .parts
            .owners
            .flush()
            .map_err(|_| PollError::OwnersGone)?;
        if !self.serving {
            // The owners start after this: the flush is queued ahead of any request.
            return Ok(());
        }
        for a in acks {
            self.ack(a).await?;
        }
        Ok(())
    }

    /// Between polls (every change so far acknowledged by the owners): the shards'
    /// images for a snapshot, each queued behind exactly the changes up to `applied`.
    fn exports(&self) {
        let feed = self.feed();
        while let Ok(reply) = feed.export_rx.try_recv() {
            match self.parts.owners.export() {
                Ok(images) => {
                    let _ = reply.send((feed.applied(), images));
                }
                Err(_) => return,
            }
        }
    }

    /// Between polls: the slot advanced to the applied position (no further than the
    /// last snapshot's), and now and then the table, the slot's state and its retained
    /// WAL checked.
    async fn housekeeping(&mut self) -> Result<(), PollError> {
        let applied = self.feed().applied().min(self.feed().confirm_cap());
        if applied > self.confirmed && self.advanced_at.elapsed() >= ADVANCE_EVERY {
            self.log_running_xacts().await?;
            self.ctl
                .execute(
                    "SELECT pg_replication_slot_advance($1::text::name, $2)",
                    &[&self.cfg.slot, &PgLsn::from(applied)],
                )
                .await?;
            self.confirmed = applied;
            self.advanced_at = Instant::now();
        }
        if self.checked_at.elapsed() < CHECK_EVERY {
            return Ok(());
        }
        self.checked_at = Instant::now();
        let r = self
            .ctl
            .query_opt(
                "SELECT (pg_current_wal_lsn() - s.restart_lsn)::bigint, coalesce(s.wal_status, ''), \
                   s.invalidation_reason, to_regclass($2)::oid, \
                   (SELECT atttypmod FROM pg_attribute WHERE attrelid = to_regclass($2) \
                      AND attname = $3 AND NOT attisdropped), \
                   EXISTS (SELECT 1 FROM pg_publication p JOIN pg_publication_rel r \
                      ON r.prpubid = p.oid WHERE p.pubname = $1 AND r.prrelid = to_regclass($2)) \
                 FROM pg_replication_slots s WHERE s.slot_name = $1",
                &[&self.cfg.slot, &self.target.table, &self.cfg.vector_column],
            )
            .await?;
        let Some(r) = r else {
            return Err(PollError::SlotLost("the slot is gone".into()));
        };
        let retained: Option<i64> = r.get(0);
        let status: String = r.get(1);
        let reason: Option<String> = r.get(2);
        let relid: Option<u32> = r.get(3);
        let typmod: Option<i32> = r.get(4);
        let published: bool = r.get(5);
        self.feed()
            .stats
            .retained_bytes
            .store(retained.unwrap_or(0).max(0) as u64, Ordering::Relaxed);
        if status == "lost" || reason.is_some() {
            return Err(PollError::SlotLost(reason.unwrap_or(status)));
        }
        if relid != Some(self.decoder.relid) {
            return Err(PollError::TableChanged(format!(
                "{} is not the table akerd started on (dropped, renamed or made anew)",
                self.target.table
            )));
        }
        if !published {
            return Err(PollError::TableChanged(format!(
                "{} is no longer in publication {}",
                self.target.table, self.cfg.slot
            )));
        }
        if typmod != Some(self.target.dim as i32) {
            return Err(PollError::TableChanged(format!(
                "column {} is no longer vector({})",
                self.cfg.vector_column, self.target.dim
            )));
        }
        Ok(())
    }

    /// The slot's restart position (where every read's decoding begins) moves only past a
    /// record of the running transactions, which the server writes every 15 s: each read
    /// would decode up to 15 s of WAL again. One written before each advance keeps it
    /// within two advances (needs superuser or EXECUTE on the function; without, said once).
    async fn log_running_xacts(&mut self) -> Result<(), PollError> {
        // Only after transactions were applied: on an idle database the record would
        // itself be new WAL to advance over, every 200 ms, forever.
        let commits = self.feed().stats.commits.load(Ordering::Relaxed);
        if !self.log_xacts || commits == self.commits_logged {
            return Ok(());
        }
        self.commits_logged = commits;
        match self
            .ctl
            .execute("SELECT pg_log_standby_snapshot()", &[])
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
                self.log_xacts = false;
                tracing::warn!(
                    "pgvector: no EXECUTE on pg_log_standby_snapshot(): each read of the change \
                     stream decodes up to 15 s of WAL (GRANT EXECUTE ON FUNCTION \
                     pg_log_standby_snapshot() TO <role>)"
                );
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The database went away: reconnect with backoff, take the lock again and resume
    /// from the slot. False: stopping, or another akerd took the slot meanwhile.
    /// Lets the control session's advisory locks (the slot's) go, bounded: a session
    /// that does not answer ends with its connection anyway.
    async fn release_slot_lock(&self) {
        let unlock = self.ctl.batch_execute("SELECT pg_advisory_unlock_all()");
        let _ = tokio::time::timeout(Duration::from_secs(2), unlock).await;
    }

    async fn reconnect(&mut self, why: &str) -> bool {
        tracing::warn!(
            reason = why,
            "pgvector: the change stream lost its connection; reconnecting"
        );
        self.feed().set_state(FeedState::Reconnecting);
        // An error the server answered leaves the old sessions up, and the slot's lock
        // with them: let it go before taking it again.
        self.release_slot_lock().await;
        let mut failures = 0u32;
        let mut pause = BACKOFF_FIRST;
        loop {
            if self.parts.stop.load(Ordering::Acquire) {
                return false;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(self.target.reconnect_max);
            let (ctl, stream, relid) = match Follower::connect(&self.target, &self.cfg).await {
                Ok(c) => c,
                Err(e @ SetupError::Held { .. }) => {
                    tracing::error!(error = %e, "pgvector: another akerd took the slot: akerd STOPS following");
                    let _ = self.flush().await;
                    self.feed().set_following(false, FeedState::Stopped);
                    return false;
                }
                Err(e) => {
                    failures += 1;
                    // Said now and then, not on every attempt.
                    if failures.is_power_of_two() {
                        tracing::warn!(error = %e, failures, "pgvector: the change stream cannot reconnect yet");
                    }
                    continue;
                }
            };
            (self.ctl, self.stream, self.peek) = (ctl, stream, None);
            if relid != self.decoder.relid {
                tracing::error!(table = %self.target.table,
                    "pgvector: the table was made anew while the database was away: the cache \
                     is flushed and akerd STOPS following its changes");
                let _ = self.flush().await;
                self.feed().set_following(false, FeedState::Stopped);
                return false;
            }
            self.feed().stats.reconnects.fetch_add(1, Ordering::Relaxed);
            match self.slot_ready(false).await {
                Ok(()) => {
                    tracing::info!(applied = %lsn_text(self.feed().applied()), "pgvector: the change stream resumes");
                    return true;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "pgvector: change stream resumption failed");
                    // This session holds the slot's lock: let it go, or the next attempt
                    // would find it held and take itself for another akerd.
                    self.release_slot_lock().await;
                }
            }
        }
    }
}
