//! The backend behind a channel: N blocking threads own the store; executors send jobs on
//! one bounded queue and await each reply on its own `bounded(1)` channel. A full queue
//! is BUSY for the request, never an unbounded pile-up.
//!
//! Writes are sequenced here, so that every shard owner sees the writes to one id in the
//! store's order (an insert and a delete of one id from two clients cannot be applied in
//! opposite orders by the store and a shard). A write is applied to the store, then its
//! message is queued to every shard owner, under a lock that covers both:
//! - embedded store: the store's own `RwLock` (hnsw_rs needs `&mut` for our tombstone
//!   bookkeeping), held alone by a write, shared by searches;
//! - pgvector: no store-wide lock. Searches take none; a write holds one of
//!   [`ID_STRIPES`] stripes (by id) from its statement until the owners have its
//!   message, so writes to different ids run in parallel. Searches and writes share
//!   the threads (one connection each), so a search can still queue behind writes for
//!   a free thread, never behind a lock;
//! - cache-aside: no store; the stripes sequence the writes.
//!
//! Queuing is the part that must not be lost: once a message is queued the owner applies
//! it even if the client's request is dropped at its deadline. The executor then awaits
//! the owners' acknowledgements, and only then replies. A pgvector write whose commit is
//! in doubt (the connection dropped, or no answer came) still strips the id from every
//! shard before the error is answered (`pgvector/in_doubt.rs`): the cache never serves
//! a row the database may have dropped or replaced. One the database rolled back, or
//! that was never sent, changes nothing.
//!
//! ```text
//!  executors ── Job ──► queue ──► Worker<S: Side> (N threads, each its S::Conn)
//!                                   S = Embedded    (embedded.rs: store, log, checkpoints)
//!                                     | PgSide      (pgvector/side.rs: one connection each)
//!                                     | CacheAside  (cache_aside.rs: no store)
//!  BackendPool ── Arc<dyn SideInfo> ─► has_store, pgvector(), store_len (executors)
//! ```
//!
//! Each side is a type: a thread's connection is the side's own (`()` in process, a
//! `PgConn` for pgvector), so a pgvector write cannot run without its connection.

mod cache_aside;
mod embedded;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shards::owner::{OwnerMsg, ShardHandle};
use shards::{Backend, Candidate, DeleteOutcome, InsertOutcome};

use super::pgvector::{PgSide, PgTarget};
use super::recall::{Check, RecallChecks, CHECK_DEADLINE, CHECK_STALE};
use crate::durable::Durable;
use crate::protocol::{Rejection, Status};
use cache_aside::CacheAside;
use embedded::Embedded;

/// A store the backend threads share.
pub type Store = Box<dyn Backend + Send + Sync>;

/// Acknowledgements of one write, one per shard owner.
pub(crate) type InsertAcks = Vec<flume::Receiver<shards::Result<InsertOutcome>>>;
pub(crate) type DeleteAcks = Vec<flume::Receiver<DeleteOutcome>>;

/// Where a committed write is in the backend's order: pgvector's WAL position after its
/// COMMIT (`pg_current_wal_insert_lsn()`, a pg_lsn as a number). `None` where every
/// acknowledged write is already in the cache (the embedded store, cache-aside) or the
/// position could not be read. A version 5 reply carries it (0 for `None`).
pub(crate) type Position = Option<u64>;

/// A DELETE as a side answers it: `existed` from the store (`None` without one), the
/// acks, the write's [`Position`].
pub(crate) type Deleted = (Option<bool>, DeleteAcks, Position);

/// Per-id write locks of the pgvector and cache-aside backends.
pub(crate) const ID_STRIPES: usize = 256;

/// What the backend answered a search.
pub(crate) struct BackendAnswer {
    pub candidates: Vec<Candidate>,
    /// As many rows as asked, or every row there is. A short answer (pgvector's index
    /// scan ran out) is served but not admitted.
    pub complete: bool,
}

pub(crate) enum Job {
    Search {
        query: Arc<[f32]>,
        n: usize,
        deadline: Option<Instant>,
        /// A SEARCH AT_POSITION the cache could not answer yet: the answer must hold
        /// that position (pgvector: a read replica must have replayed it).
        at_position: Position,
        reply: flume::Sender<Result<BackendAnswer, Rejection>>,
    },
    Insert {
        id: u64,
        vector: Arc<[f32]>,
        payload: Vec<u8>,
        /// The two nearest shards: they run the fast path.
        near: [usize; 2],
        deadline: Option<Instant>,
        /// The acks and the write's position.
        reply: flume::Sender<Result<(InsertAcks, Position), Rejection>>,
    },
    Delete {
        id: u64,
        deadline: Option<Instant>,
        /// `existed` from the store (`None` in cache-aside mode), the acks and the
        /// write's position.
        reply: flume::Sender<Result<Deleted, Rejection>>,
    },
}

/// An insert as a side receives it.
pub(crate) struct NewRow {
    pub id: u64,
    pub vector: Arc<[f32]>,
    pub payload: Vec<u8>,
    /// The two nearest shards: they run the fast path.
    pub near: [usize; 2],
    pub deadline: Option<Instant>,
}

/// What the backend threads serve from, as start-up hands it over; [`BackendPool::start`]
/// makes it the running [`Side`].
pub(crate) enum StoreSide {
    Embedded(RwLock<Store>),
    Pgvector(Arc<PgTarget>),
    CacheAside,
}

/// What the executors read of the running side (object safe: the pool is not generic).
pub(crate) trait SideInfo: Send + Sync {
    /// Whether misses are answered here (false: cache-aside, the client FILLs).
    fn has_store(&self) -> bool {
        true
    }

    /// The pgvector target, for its connection counters.
    fn pgvector(&self) -> Option<&PgTarget> {
        None
    }

    /// Live rows of the embedded store (`None` for pgvector and cache-aside).
    fn store_len(&self) -> Option<usize> {
        None
    }
}

/// A store side as the backend threads run it. Writes apply to the store, then queue to
/// the owners (`Owners`), both under the side's lock for the id, and return the acks.
pub(crate) trait Side: SideInfo + 'static {
    /// A backend thread's own connection: `()` for a store in this process.
    type Conn;

    /// The calling thread's connection, at its start; `None`: the thread ends (logged).
    fn connect(&self) -> Option<Self::Conn>;

    /// The thread has had no job for a poll interval (pgvector: reconnect if due).
    fn idle(&self, _conn: &mut Self::Conn) {}

    /// The `n` nearest to `q`; an answer that holds at least `at_position` when set
    /// (pgvector's read replicas; every other store holds every acknowledged write).
    fn search(
        &self,
        conn: &mut Self::Conn,
        q: &[f32],
        n: usize,
        deadline: Option<Instant>,
        at_position: Position,
    ) -> Result<BackendAnswer, Rejection>;

    /// The acks, and the write's [`Position`].
    fn insert(
        &self,
        conn: &mut Self::Conn,
        owners: &Owners,
        row: &NewRow,
    ) -> Result<(InsertAcks, Position), Rejection>;

    /// `existed` from the store (`None` without one), the acks, and the write's
    /// [`Position`].
    fn delete(
        &self,
        conn: &mut Self::Conn,
        owners: &Owners,
        id: u64,
        deadline: Option<Instant>,
    ) -> Result<Deleted, Rejection>;

    /// Of a recall check's served ids, those the store says it no longer holds (a
    /// store that cannot say returns none).
    fn gone(&self, _served: &[u64]) -> Vec<u64> {
        Vec::new()
    }
}

/// Per-id write order: [`ID_STRIPES`] locks, an id's chosen by a hash of it; each holds
/// a `T` (pgvector: the session of a write in doubt).
pub(crate) struct IdStripes<T> {
    stripes: Vec<Mutex<T>>,
}

impl<T: Default> IdStripes<T> {
    pub(crate) fn new() -> IdStripes<T> {
        IdStripes {
            stripes: (0..ID_STRIPES).map(|_| Mutex::new(T::default())).collect(),
        }
    }

    pub(crate) fn lock(&self, id: u64) -> MutexGuard<'_, T> {
        let i = (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % self.stripes.len();
        self.stripes[i].lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The shard owners, as the backend threads queue to them.
#[derive(Clone)]
pub(crate) struct Owners {
    shards: Vec<ShardHandle>,
}

impl Owners {
    pub(crate) fn new(shards: Vec<ShardHandle>) -> Owners {
        Owners { shards }
    }

    pub(crate) fn len(&self) -> usize {
        self.shards.len()
    }

    /// Every owner drops its entries (TRUNCATE, a table that changed, a lost slot).
    pub(crate) fn flush(&self) -> Result<Vec<flume::Receiver<()>>, Rejection> {
        let mut acks = Vec::with_capacity(self.shards.len());
        for (s, h) in self.shards.iter().enumerate() {
            let (tx, rx) = flume::bounded(1);
            h.sender()
                .send(OwnerMsg::Flush { ack: tx })
                .map_err(|_| owner_gone(s))?;
            acks.push(rx);
        }
        Ok(acks)
    }

    /// Every owner's warm-restart image, as of every message queued before.
    pub(crate) fn export(
        &self,
    ) -> Result<Vec<flume::Receiver<shards::snapshot::ShardImage>>, Rejection> {
        let mut acks = Vec::with_capacity(self.shards.len());
        for (s, h) in self.shards.iter().enumerate() {
            let (tx, rx) = flume::bounded(1);
            h.sender()
                .send(OwnerMsg::Export { ack: tx })
                .map_err(|_| owner_gone(s))?;
            acks.push(rx);
        }
        Ok(acks)
    }

    /// Every owner gets the insert; the two nearest run the fast path.
    pub(crate) fn queue_insert(
        &self,
        id: u64,
        vector: &Arc<[f32]>,
        near: [usize; 2],
    ) -> Result<InsertAcks, Rejection> {
        let mut acks = Vec::with_capacity(self.shards.len());
        for (s, h) in self.shards.iter().enumerate() {
            let (tx, rx) = flume::bounded(1);
            let msg = OwnerMsg::Insert {
                id,
                vector: vector.clone(),
                fast_path: near.contains(&s),
                ack: tx,
            };
            // Waits for room: owners never wait on us, so this is bounded by their pace.
            h.sender().send(msg).map_err(|_| owner_gone(s))?;
            acks.push(rx);
        }
        Ok(acks)
    }

    pub(crate) fn queue_delete(&self, id: u64) -> Result<DeleteAcks, Rejection> {
        let mut acks = Vec::with_capacity(self.shards.len());
        for (s, h) in self.shards.iter().enumerate() {
            let (tx, rx) = flume::bounded(1);
            h.sender()
                .send(OwnerMsg::Delete { id, ack: tx })
                .map_err(|_| owner_gone(s))?;
            acks.push(rx);
        }
        Ok(acks)
    }
}

/// The executors' side: the job queue.
pub(crate) struct BackendPool {
    tx: flume::Sender<Job>,
    side: Arc<dyn SideInfo>,
}

/// What every backend thread shares, whatever the side.
struct Worker<S> {
    side: Arc<S>,
    owners: Owners,
    stop: Arc<AtomicBool>,
    /// The recall floor's checks, run only when no request job waits (`recall.rs`).
    checks: Option<(Arc<RecallChecks>, flume::Receiver<Check>)>,
    /// Recall checks running now (at most `threads - 1`: one thread stays for requests).
    checks_running: AtomicUsize,
    threads: usize,
}

/// What the threads share whatever the side, before it is known.
struct Parts {
    owners: Owners,
    stop: Arc<AtomicBool>,
    checks: Option<(Arc<RecallChecks>, flume::Receiver<Check>)>,
}

/// The pool's settings from the config's backend table.
struct Threads {
    threads: usize,
    depth: usize,
    nice: i32,
    idle: bool,
}

/// Longest wait at start for the backend threads' first connection attempts.
const READY_WAIT: Duration = Duration::from_secs(30);

/// How often an idle backend thread looks at the stop flag (and, for pgvector, whether
/// a lost connection is due for another attempt).
const STOP_POLL: Duration = Duration::from_millis(50);

impl BackendPool {
    #[allow(clippy::too_many_arguments)] // the config's backend table, spelled out
    pub(crate) fn start(
        side: StoreSide,
        threads: usize,
        depth: usize,
        nice: i32,
        idle: bool,
        shards: Vec<ShardHandle>,
        stop: Arc<AtomicBool>,
        checks: Option<(Arc<RecallChecks>, flume::Receiver<Check>)>,
        durable: Option<Arc<Durable>>,
    ) -> std::io::Result<(BackendPool, Vec<JoinHandle<()>>)> {
        let t = Threads {
            threads: threads.max(1),
            depth,
            nice,
            idle,
        };
        let parts = Parts {
            owners: Owners { shards },
            stop,
            checks,
        };
        match side {
            StoreSide::Embedded(store) => {
                BackendPool::spawn(Embedded::new(store, durable), parts, &t)
            }
            StoreSide::Pgvector(target) => BackendPool::spawn(PgSide::new(target), parts, &t),
            StoreSide::CacheAside => BackendPool::spawn(CacheAside::new(), parts, &t),
        }
    }

    /// Starts the threads of `side`.
    fn spawn<S: Side>(
        side: S,
        parts: Parts,
        t: &Threads,
    ) -> std::io::Result<(BackendPool, Vec<JoinHandle<()>>)> {
        let (tx, rx) = flume::bounded(t.depth.max(1));
        let side = Arc::new(side);
        let worker = Arc::new(Worker {
            side: side.clone(),
            owners: parts.owners,
            stop: parts.stop,
            checks: parts.checks,
            checks_running: AtomicUsize::new(0),
            threads: t.threads,
        });
        let mut handles = Vec::with_capacity(t.threads);
        let (ready_tx, ready_rx) = flume::bounded(t.threads);
        for i in 0..t.threads {
            let (w, rx, ready) = (worker.clone(), rx.clone(), ready_tx.clone());
            let (nice, idle) = (t.nice, t.idle);
            handles.push(
                std::thread::Builder::new()
                    .name(format!("aker-backend-{i}"))
                    .spawn(move || {
                        lower_priority(nice, idle);
                        w.run(rx, ready)
                    })?,
            );
        }
        // A pgvector pool is connected before the daemon says it listens (each thread's
        // first attempt is bounded; one that failed retries in the background).
        let until = Instant::now() + READY_WAIT;
        for _ in 0..t.threads {
            if ready_rx.recv_deadline(until).is_err() {
                tracing::warn!("backend threads not all ready after {READY_WAIT:?}");
                break;
            }
        }
        Ok((BackendPool { tx, side }, handles))
    }

    /// Whether misses are answered here (false: cache-aside, the client FILLs).
    pub(crate) fn has_store(&self) -> bool {
        self.side.has_store()
    }

    /// The pgvector target, for its connection counters.
    pub(crate) fn pgvector(&self) -> Option<&PgTarget> {
        self.side.pgvector()
    }

    /// Live rows of the embedded store (`None` for pgvector and cache-aside).
    pub(crate) fn store_len(&self) -> Option<usize> {
        self.side.store_len()
    }

    pub(crate) fn queue_len(&self) -> usize {
        self.tx.len()
    }

    /// Queues `job`; BUSY when the queue is full.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Rejection> {
        self.tx.try_send(job).map_err(|e| match e {
            flume::TrySendError::Full(_) => Rejection::new(Status::Busy, "backend queue is full"),
            flume::TrySendError::Disconnected(_) => {
                Rejection::new(Status::Unavailable, "backend stopped")
            }
        })
    }
}

/// Sets this thread's nice value (Linux: nice is per thread), or SCHED_IDLE. Lowering
/// one's own priority needs no privilege; a failure is logged and the thread runs as
/// it is.
fn lower_priority(nice: i32, idle: bool) {
    if idle {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; `param` outlives the call.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "backend thread: SCHED_IDLE failed");
        }
        return;
    }
    if nice == 0 {
        return;
    }
    // SAFETY: plain syscalls on this thread's own id.
    let rc = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice)
    };
    if rc != 0 {
        tracing::warn!(nice, error = %std::io::Error::last_os_error(), "backend thread: setpriority failed");
    }
}

fn owner_gone(shard: usize) -> Rejection {
    Rejection::new(
        Status::Unavailable,
        format!("shard {shard}'s owner has stopped"),
    )
}

fn deadline_passed() -> Rejection {
    Rejection::new(
        Status::DeadlineExceeded,
        "the request's deadline passed while it waited for a backend thread",
    )
}

impl<S: Side> Worker<S> {
    fn run(&self, rx: flume::Receiver<Job>, ready: flume::Sender<()>) {
        // The thread's own connection (pgvector: the pool is one connection per thread).
        let Some(mut conn) = self.side.connect() else {
            let _ = ready.send(());
            return;
        };
        let _ = ready.send(());
        drop(ready);
        loop {
            let job = match rx.try_recv() {
                Ok(job) => job,
                Err(flume::TryRecvError::Disconnected) => return,
                Err(flume::TryRecvError::Empty) => {
                    // No request waits: the thread's spare time is the recall checks', as
                    // long as another thread stays free for the next request.
                    if let Some(check) = self.take_check() {
                        self.run_check(&mut conn, check);
                        self.checks_running.fetch_sub(1, Ordering::AcqRel);
                        continue;
                    }
                    match rx.recv_timeout(STOP_POLL) {
                        Ok(job) => job,
                        Err(flume::RecvTimeoutError::Timeout)
                            if !self.stop.load(Ordering::Acquire) =>
                        {
                            self.side.idle(&mut conn);
                            continue;
                        }
                        Err(_) => return,
                    }
                }
            };
            self.serve(&mut conn, job);
        }
    }

    fn serve(&self, conn: &mut S::Conn, job: Job) {
        match job {
            Job::Search {
                query,
                n,
                deadline,
                at_position,
                reply,
            } => {
                // The request was dropped: skip the work.
                if reply.is_disconnected() {
                    return;
                }
                // Past its deadline: say so (a dropped sender would read as a
                // stopped backend).
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    let _ = reply.send(Err(deadline_passed()));
                    return;
                }
                let _ = reply.send(self.side.search(conn, &query, n, deadline, at_position));
            }
            Job::Insert {
                id,
                vector,
                payload,
                near,
                deadline,
                reply,
            } => {
                let row = NewRow {
                    id,
                    vector,
                    payload,
                    near,
                    deadline,
                };
                let _ = reply.send(self.side.insert(conn, &self.owners, &row));
            }
            Job::Delete {
                id,
                deadline,
                reply,
            } => {
                let _ = reply.send(self.side.delete(conn, &self.owners, id, deadline));
            }
        }
    }

    /// A queued recall check, if one may run now (counted in `checks_running`).
    fn take_check(&self) -> Option<Check> {
        let (_, rx) = self.checks.as_ref()?;
        let most = self.threads.saturating_sub(1).max(1);
        if self.checks_running.fetch_add(1, Ordering::AcqRel) >= most {
            self.checks_running.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let c = rx.try_recv().ok();
        if c.is_none() {
            self.checks_running.fetch_sub(1, Ordering::AcqRel);
        }
        c
    }

    /// One recall check (`recall.rs`): the backend's answer for the hit's request, its
    /// recall into the floor, and the repairs it calls for.
    fn run_check(&self, conn: &mut S::Conn, c: Check) {
        let Some((checks, _)) = &self.checks else {
            return;
        };
        let counters = &checks.counters;
        if c.queued.elapsed() > CHECK_STALE {
            counters.dropped_stale.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let deadline = Some(Instant::now() + CHECK_DEADLINE);
        let answer = match self.side.search(conn, &c.query, c.n, deadline, None) {
            Ok(a) => a,
            Err(_) => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        // A served id the store no longer holds is stripped everywhere (a DELETE that
        // bypassed akerd, or a defect): harmless if it came back meanwhile.
        for id in self.side.gone(&c.served) {
            // Also when a DELETE through akerd raced the check (then the strip is a
            // repeat); a hint, so a full owner queue never blocks this thread.
            tracing::debug!(
                id,
                "recall check: a served id is not in the store; stripped"
            );
            counters.deleted_ids.fetch_add(1, Ordering::Relaxed);
            for h in &self.owners.shards {
                let (ack, _) = flume::bounded(1);
                h.hint(OwnerMsg::Delete { id, ack });
            }
        }
        let reference: Vec<u64> = answer.candidates.iter().take(c.k).map(|a| a.id).collect();
        let recall = shards::floor::recall_at_k(&c.served, &reference, c.k);
        checks.record(c.kind, recall, &self.owners.shards);
        if recall < 1.0 && answer.complete {
            if let Some(ticket) = c.repair {
                let admit = OwnerMsg::Admit {
                    ticket,
                    answer: answer.candidates,
                    ack: None,
                };
                if self.owners.shards[c.shard].hint(admit) {
                    counters.repairs.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
