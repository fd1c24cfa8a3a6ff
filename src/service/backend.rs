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
//! shard before the error is answered: the cache never serves a row the database may
//! have dropped or replaced. One the database rolled back, or that was never sent,
//! changes nothing.

// The locks here are the backend's own, not the cache's engine (whose read path takes
// none).
#![allow(clippy::disallowed_types)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shards::owner::{OwnerMsg, ShardHandle};
use shards::{Backend, Candidate, DeleteOutcome, InsertOutcome};

use super::pgvector::{PgConn, PgTarget, Session, WriteError};
use super::recall::{Check, RecallChecks, CHECK_DEADLINE, CHECK_STALE};
use crate::durable::wal::Op;
use crate::durable::Durable;
use crate::protocol::{Rejection, Status};

/// A store the backend threads share.
pub type Store = Box<dyn Backend + Send + Sync>;

/// Acknowledgements of one write, one per shard owner.
pub type InsertAcks = Vec<flume::Receiver<shards::Result<InsertOutcome>>>;
pub type DeleteAcks = Vec<flume::Receiver<DeleteOutcome>>;

/// Per-id write locks of the pgvector and cache-aside backends.
pub const ID_STRIPES: usize = 256;

/// How long a failed write waits for the owners to strip its id before answering.
const STRIP_WAIT: Duration = Duration::from_secs(5);

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
        reply: flume::Sender<Result<BackendAnswer, Rejection>>,
    },
    Insert {
        id: u64,
        vector: Arc<[f32]>,
        payload: Vec<u8>,
        /// The two nearest shards: they run the fast path.
        near: [usize; 2],
        deadline: Option<Instant>,
        reply: flume::Sender<Result<InsertAcks, Rejection>>,
    },
    Delete {
        id: u64,
        deadline: Option<Instant>,
        /// `existed` from the store (`None` in cache-aside mode), and the acks.
        reply: flume::Sender<Result<(Option<bool>, DeleteAcks), Rejection>>,
    },
}

/// What the backend threads serve from.
pub(crate) enum StoreSide {
    Embedded(RwLock<Store>),
    Pgvector(Arc<PgTarget>),
    CacheAside,
}

/// The executors' side: the job queue.
pub(crate) struct BackendPool {
    tx: flume::Sender<Job>,
    worker: Arc<Worker>,
}

struct Worker {
    side: StoreSide,
    /// Per-id write order; a stripe holds the server session of a write in doubt that
    /// could not be confirmed gone: writes to its ids wait (UNAVAILABLE) until it is.
    stripes: Vec<Mutex<Option<Session>>>,
    shards: Vec<ShardHandle>,
    stop: Arc<AtomicBool>,
    /// The recall floor's checks, run only when no request job waits (`recall.rs`).
    checks: Option<(Arc<RecallChecks>, flume::Receiver<Check>)>,
    /// The embedded store's log and checkpoints (`backend.data_dir`).
    durable: Option<Arc<Durable>>,
    /// The embedded store's live rows, kept by its writers: metrics read it on
    /// executors, which must never wait for the store's lock.
    rows: std::sync::atomic::AtomicUsize,
    /// Recall checks running now (at most `threads - 1`: one thread stays for requests).
    checks_running: std::sync::atomic::AtomicUsize,
    threads: usize,
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
        let (tx, rx) = flume::bounded(depth.max(1));
        let worker = Arc::new(Worker {
            stripes: (0..ID_STRIPES).map(|_| Mutex::new(None)).collect(),
            shards,
            stop,
            rows: std::sync::atomic::AtomicUsize::new(match &side {
                StoreSide::Embedded(store) => store.read().unwrap_or_else(|e| e.into_inner()).len(),
                _ => 0,
            }),
            side,
            checks,
            durable,
            checks_running: std::sync::atomic::AtomicUsize::new(0),
            threads: threads.max(1),
        });
        let mut handles = Vec::with_capacity(threads);
        let (ready_tx, ready_rx) = flume::bounded(threads.max(1));
        for i in 0..threads.max(1) {
            let (w, rx, ready) = (worker.clone(), rx.clone(), ready_tx.clone());
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
        for _ in 0..threads.max(1) {
            if ready_rx.recv_deadline(until).is_err() {
                tracing::warn!("backend threads not all ready after {READY_WAIT:?}");
                break;
            }
        }
        Ok((BackendPool { tx, worker }, handles))
    }

    /// Whether misses are answered here (false: cache-aside, the client FILLs).
    pub(crate) fn has_store(&self) -> bool {
        !matches!(self.worker.side, StoreSide::CacheAside)
    }

    /// The pgvector target, for its connection counters.
    pub(crate) fn pgvector(&self) -> Option<&PgTarget> {
        match &self.worker.side {
            StoreSide::Pgvector(t) => Some(t),
            _ => None,
        }
    }

    /// Live rows of the embedded store (`None` for pgvector and cache-aside).
    pub(crate) fn store_len(&self) -> Option<usize> {
        match &self.worker.side {
            StoreSide::Embedded(_) => Some(self.worker.rows.load(Ordering::Relaxed)),
            _ => None,
        }
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

/// Before a write to `id`: a write in doubt on its stripe whose session was not
/// confirmed gone might still commit after this one, so it is settled first; while it
/// cannot be, the write is refused.
fn settle_stripe(stripe: &mut Option<Session>, pg: &mut PgConn, id: u64) -> Result<(), Rejection> {
    if let Some(s) = stripe.as_ref() {
        if !pg.settle(s) {
            return Err(Rejection::new(
                Status::Unavailable,
                format!(
                    "an earlier write in doubt to an id of id {id}'s stripe is not settled \
                     (server process {} still there)",
                    s.pid
                ),
            ));
        }
        *stripe = None;
    }
    Ok(())
}

/// A write the log could not take or sync: not acknowledged, and (the log having
/// failed) no later write is either; searches go on.
fn log_failed(e: std::io::Error) -> Rejection {
    tracing::error!(error = %e, "the store's log failed: writes are refused from now on");
    Rejection::new(
        Status::Unavailable,
        format!("the write could not be made durable: {e}"),
    )
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

impl Worker {
    fn run(&self, rx: flume::Receiver<Job>, ready: flume::Sender<()>) {
        // A pgvector thread's own connection: the pool is one connection per thread.
        let mut pg = match &self.side {
            StoreSide::Pgvector(t) => match PgConn::new(t.clone()) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::error!(error = %e, "backend thread: no runtime for pgvector");
                    let _ = ready.send(());
                    return;
                }
            },
            _ => None,
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
                        self.run_check(pg.as_mut(), check);
                        self.checks_running.fetch_sub(1, Ordering::AcqRel);
                        continue;
                    }
                    match rx.recv_timeout(STOP_POLL) {
                        Ok(job) => job,
                        Err(flume::RecvTimeoutError::Timeout)
                            if !self.stop.load(Ordering::Acquire) =>
                        {
                            if let Some(pg) = pg.as_mut() {
                                pg.reconnect_if_due(false);
                            }
                            continue;
                        }
                        Err(_) => return,
                    }
                }
            };
            match job {
                Job::Search {
                    query,
                    n,
                    deadline,
                    reply,
                } => {
                    // The request was dropped: skip the work.
                    if reply.is_disconnected() {
                        continue;
                    }
                    // Past its deadline: say so (a dropped sender would read as a
                    // stopped backend).
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        let _ = reply.send(Err(deadline_passed()));
                        continue;
                    }
                    let _ = reply.send(self.search(pg.as_mut(), &query, n, deadline));
                }
                Job::Insert {
                    id,
                    vector,
                    payload,
                    near,
                    deadline,
                    reply,
                } => {
                    let r = self.insert(pg.as_mut(), id, vector, &payload, near, deadline);
                    let _ = reply.send(r);
                }
                Job::Delete {
                    id,
                    deadline,
                    reply,
                } => {
                    let _ = reply.send(self.delete(pg.as_mut(), id, deadline));
                }
            }
        }
    }

    fn search(
        &self,
        pg: Option<&mut PgConn>,
        q: &[f32],
        n: usize,
        deadline: Option<Instant>,
    ) -> Result<BackendAnswer, Rejection> {
        match (&self.side, pg) {
            (StoreSide::Embedded(store), _) => {
                let store = store.read().unwrap_or_else(|e| e.into_inner());
                let candidates = store.search(q, n)?;
                // The embedded stores return min(n, live rows): complete either way.
                Ok(BackendAnswer {
                    candidates,
                    complete: true,
                })
            }
            (StoreSide::Pgvector(_), Some(pg)) => {
                let a = pg.search(q, n, deadline)?;
                Ok(BackendAnswer {
                    candidates: a.candidates,
                    complete: a.complete,
                })
            }
            _ => Ok(BackendAnswer {
                candidates: Vec::new(),
                complete: false,
            }),
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
    fn run_check(&self, pg: Option<&mut PgConn>, c: Check) {
        let Some((checks, _)) = &self.checks else {
            return;
        };
        let counters = &checks.counters;
        if c.queued.elapsed() > CHECK_STALE {
            counters.dropped_stale.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let deadline = Some(Instant::now() + CHECK_DEADLINE);
        let answer = match self.search(pg, &c.query, c.n, deadline) {
            Ok(a) => a,
            Err(_) => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        // A served id the store no longer holds is stripped everywhere (a DELETE that
        // bypassed akerd, or a defect): harmless if it came back meanwhile.
        if let StoreSide::Embedded(store) = &self.side {
            let gone: Vec<u64> = {
                let store = store.read().unwrap_or_else(|e| e.into_inner());
                c.served
                    .iter()
                    .copied()
                    .filter(|&id| store.contains(id) == Some(false))
                    .collect()
            };
            for id in gone {
                // Also when a DELETE through akerd raced the check (then the strip is a
                // repeat); a hint, so a full owner queue never blocks this thread.
                tracing::debug!(
                    id,
                    "recall check: a served id is not in the store; stripped"
                );
                counters.deleted_ids.fetch_add(1, Ordering::Relaxed);
                for h in &self.shards {
                    let (ack, _) = flume::bounded(1);
                    h.hint(OwnerMsg::Delete { id, ack });
                }
            }
        }
        let reference: Vec<u64> = answer.candidates.iter().take(c.k).map(|a| a.id).collect();
        let recall = shards::floor::recall_at_k(&c.served, &reference, c.k);
        checks.record(c.kind, recall, &self.shards);
        if recall < 1.0 && answer.complete {
            if let Some(ticket) = c.repair {
                let admit = OwnerMsg::Admit {
                    ticket,
                    answer: answer.candidates,
                    ack: None,
                };
                if self.shards[c.shard].hint(admit) {
                    counters.repairs.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Appends a write to the log (durable store only), under the store's write lock.
    fn log(&self, op: impl FnOnce() -> Op) -> Result<Option<u64>, Rejection> {
        let Some(d) = &self.durable else {
            return Ok(None);
        };
        d.wal.append(&op()).map(Some).map_err(log_failed)
    }

    /// Waits (outside the store's lock) until the write logged as `seq` is on stable
    /// storage, then starts a checkpoint if the log has grown past its size.
    fn made_durable(&self, seq: Option<u64>) -> Result<(), Rejection> {
        let (Some(d), Some(seq)) = (&self.durable, seq) else {
            return Ok(());
        };
        d.wal.wait_durable(seq).map_err(log_failed)?;
        if d.checkpoint_due() {
            self.start_checkpoint(d);
        }
        Ok(())
    }

    /// Rotates the log, exports the rows and dumps an HNSW store's graph under the
    /// store's read lock (writes wait for it, searches do not), then writes the
    /// checkpoint on its own thread. Writers wait for the graph's dump too: it must be of
    /// the state the rows are: 1.21 s for 400k x 50 (bench/results/durable.md).
    fn start_checkpoint(&self, d: &Durable) {
        let StoreSide::Embedded(store) = &self.side else {
            return;
        };
        if !d.begin_checkpoint() {
            return;
        }
        let exported = {
            let _gate = d.gate.lock();
            let store = store.read().unwrap_or_else(|e| e.into_inner());
            match (d.wal.rotate(), store.export()) {
                (Ok(seq), Some(rows)) => {
                    let graph = d.dump_graph(seq, &**store);
                    Some((seq, store.dim(), rows, graph))
                }
                (Err(e), _) => {
                    tracing::error!(error = %e, "log rotation for a checkpoint failed");
                    None
                }
                (_, None) => None,
            }
        };
        match exported {
            Some((seq, dim, rows, graph)) => {
                d.checkpoint(seq, dim, rows, graph);
            }
            None => d.abandon_checkpoint(),
        }
    }

    fn stripe(&self, id: u64) -> std::sync::MutexGuard<'_, Option<Session>> {
        let i = (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % self.stripes.len();
        self.stripes[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(
        &self,
        pg: Option<&mut PgConn>,
        id: u64,
        vector: Arc<[f32]>,
        payload: &[u8],
        near: [usize; 2],
        deadline: Option<Instant>,
    ) -> Result<InsertAcks, Rejection> {
        match (&self.side, pg) {
            (StoreSide::Embedded(store), _) => {
                let (acks, seq) = {
                    let _gate = self.durable.as_ref().map(|d| d.gate.lock());
                    let mut store = store.write().unwrap_or_else(|e| e.into_inner());
                    // Refused before it is logged: a logged write is one recovery applies.
                    shards::error::validate_vector(&vector, store.dim())?;
                    let op = || Op::Insert {
                        id,
                        vector: vector.to_vec(),
                    };
                    let seq = self.log(op)?;
                    store.insert(id, &vector)?;
                    self.rows.store(store.len(), Ordering::Relaxed);
                    (self.queue_insert(id, &vector, near)?, seq)
                };
                self.made_durable(seq)?;
                Ok(acks)
            }
            (StoreSide::Pgvector(_), Some(pg)) => {
                let mut stripe = self.stripe(id);
                settle_stripe(&mut stripe, pg, id)?;
                match pg.insert(id, &vector, payload, deadline) {
                    Ok(()) => self.queue_insert(id, &vector, near),
                    Err(e) => {
                        *stripe = e.unsettled.clone();
                        Err(self.after_failed_write(id, e))
                    }
                }
            }
            _ => {
                let _order = self.stripe(id);
                self.queue_insert(id, &vector, near)
            }
        }
    }

    fn delete(
        &self,
        pg: Option<&mut PgConn>,
        id: u64,
        deadline: Option<Instant>,
    ) -> Result<(Option<bool>, DeleteAcks), Rejection> {
        match (&self.side, pg) {
            (StoreSide::Embedded(store), _) => {
                let (existed, acks, seq) = {
                    let _gate = self.durable.as_ref().map(|d| d.gate.lock());
                    let mut store = store.write().unwrap_or_else(|e| e.into_inner());
                    // Nothing to log for an id the store does not hold, but the answer
                    // ("not there") rests on the writes logged before: it waits for them.
                    let seq = match (store.contains(id), &self.durable) {
                        (Some(false), Some(d)) => Some(d.wal.written()),
                        _ => self.log(|| Op::Delete { id })?,
                    };
                    let existed = store.delete(id)?;
                    self.rows.store(store.len(), Ordering::Relaxed);
                    (existed, self.queue_delete(id)?, seq)
                };
                self.made_durable(seq)?;
                Ok((Some(existed), acks))
            }
            (StoreSide::Pgvector(_), Some(pg)) => {
                let mut stripe = self.stripe(id);
                settle_stripe(&mut stripe, pg, id)?;
                match pg.delete(id, deadline) {
                    Ok(existed) => Ok((Some(existed), self.queue_delete(id)?)),
                    Err(e) => {
                        *stripe = e.unsettled.clone();
                        Err(self.after_failed_write(id, e))
                    }
                }
            }
            _ => {
                let _order = self.stripe(id);
                Ok((None, self.queue_delete(id)?))
            }
        }
    }

    /// Every owner gets the insert; the two nearest run the fast path.
    fn queue_insert(
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

    fn queue_delete(&self, id: u64) -> Result<DeleteAcks, Rejection> {
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

    /// A write that failed. Rolled back or never sent: nothing changed, the error is
    /// answered as it is. In doubt (the connection was lost, or no answer came, around
    /// the commit; its server session has been ended by then): `id` is stripped from
    /// every shard first (harmless if the row is still there: its entries promote a
    /// reserve), so the cache cannot keep serving a version of the row the database
    /// may no longer hold.
    fn after_failed_write(&self, id: u64, e: WriteError) -> Rejection {
        if !e.in_doubt {
            return e.rejection;
        }
        match self.queue_delete(id) {
            Ok(acks) => {
                let until = Instant::now() + STRIP_WAIT;
                for a in acks {
                    let left = until.saturating_duration_since(Instant::now());
                    if a.recv_timeout(left).is_err() {
                        tracing::warn!(id, "a shard did not confirm stripping a failed write's id");
                    }
                }
                e.rejection
            }
            Err(gone) => gone,
        }
    }
}
