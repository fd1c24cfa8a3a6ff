//! The backend behind a channel: N blocking threads own the store; executors send jobs on
//! one bounded queue and await each reply on its own `bounded(1)` channel
//! (ARCHITECTURE.md: "Blocking clients run on their own threads and talk to executors
//! over channels"). A full queue is BUSY for the request, never an unbounded pile-up.
//!
//! Writes are sequenced here. An INSERT or DELETE applies to the store and then queues
//! its message to every shard owner while it still holds the store's write lock, so
//! every owner sees writes in exactly the store's order (an insert and a delete of one
//! id from two clients cannot be applied in opposite orders by the store and a shard).
//! Queuing is the part that must not be lost: once a message is queued the owner applies
//! it even if the client's request is dropped at its deadline. The executor then awaits
//! the owners' acknowledgements, and only then replies.
//!
//! In cache-aside mode there is no store; the threads still sequence the writes.

// The store's RwLock is the backend's own, not the cache's: searches share it, writes
// take it alone (hnsw_rs needs `&mut` for our tombstone bookkeeping).
#![allow(clippy::disallowed_types)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shards::owner::{OwnerMsg, ShardHandle};
use shards::{Backend, Candidate, DeleteOutcome, Error, InsertOutcome};

use crate::protocol::{Rejection, Status};

/// A store the backend threads share.
pub type Store = Box<dyn Backend + Send + Sync>;

/// Acknowledgements of one write, one per shard owner.
pub type InsertAcks = Vec<flume::Receiver<shards::Result<InsertOutcome>>>;
pub type DeleteAcks = Vec<flume::Receiver<DeleteOutcome>>;

pub(crate) enum Job {
    Search {
        query: Arc<[f32]>,
        n: usize,
        deadline: Option<Instant>,
        reply: flume::Sender<shards::Result<Vec<Candidate>>>,
    },
    Insert {
        id: u64,
        vector: Arc<[f32]>,
        /// The two nearest shards: they run the fast path.
        near: [usize; 2],
        reply: flume::Sender<shards::Result<InsertAcks>>,
    },
    Delete {
        id: u64,
        /// `existed` from the store (`None` in cache-aside mode), and the acks.
        reply: flume::Sender<shards::Result<(Option<bool>, DeleteAcks)>>,
    },
}

/// The executors' side: the job queue.
pub(crate) struct BackendPool {
    tx: flume::Sender<Job>,
    embedded: bool,
}

struct Worker {
    store: RwLock<Option<Store>>,
    shards: Vec<ShardHandle>,
    stop: Arc<AtomicBool>,
}

/// How often an idle backend thread looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);

impl BackendPool {
    pub(crate) fn start(
        store: Option<Store>,
        threads: usize,
        depth: usize,
        nice: i32,
        idle: bool,
        shards: Vec<ShardHandle>,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<(BackendPool, Vec<JoinHandle<()>>)> {
        let (tx, rx) = flume::bounded(depth.max(1));
        let embedded = store.is_some();
        let worker = Arc::new(Worker {
            store: RwLock::new(store),
            shards,
            stop,
        });
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads.max(1) {
            let (w, rx) = (worker.clone(), rx.clone());
            handles.push(
                std::thread::Builder::new()
                    .name(format!("aker-backend-{i}"))
                    .spawn(move || {
                        lower_priority(nice, idle);
                        w.run(rx)
                    })?,
            );
        }
        Ok((BackendPool { tx, embedded }, handles))
    }

    pub(crate) fn is_embedded(&self) -> bool {
        self.embedded
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

impl Worker {
    fn run(&self, rx: flume::Receiver<Job>) {
        loop {
            let job = match rx.recv_timeout(STOP_POLL) {
                Ok(job) => job,
                Err(flume::RecvTimeoutError::Timeout) if !self.stop.load(Ordering::Acquire) => {
                    continue
                }
                Err(_) => return,
            };
            match job {
                Job::Search {
                    query,
                    n,
                    deadline,
                    reply,
                } => {
                    // The request was dropped (deadline) or is past it: skip the work.
                    if reply.is_disconnected() || deadline.is_some_and(|d| Instant::now() >= d) {
                        continue;
                    }
                    let _ = reply.send(self.search(&query, n));
                }
                Job::Insert {
                    id,
                    vector,
                    near,
                    reply,
                } => {
                    let _ = reply.send(self.insert(id, vector, near));
                }
                Job::Delete { id, reply } => {
                    let _ = reply.send(self.delete(id));
                }
            }
        }
    }

    fn search(&self, q: &[f32], n: usize) -> shards::Result<Vec<Candidate>> {
        let store = self.store.read().unwrap_or_else(|e| e.into_inner());
        match store.as_ref() {
            Some(s) => s.search(q, n),
            None => Ok(Vec::new()),
        }
    }

    fn insert(&self, id: u64, vector: Arc<[f32]>, near: [usize; 2]) -> shards::Result<InsertAcks> {
        let mut store = self.store.write().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = store.as_mut() {
            s.insert(id, &vector)?;
        }
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

    fn delete(&self, id: u64) -> shards::Result<(Option<bool>, DeleteAcks)> {
        let mut store = self.store.write().unwrap_or_else(|e| e.into_inner());
        let existed = match store.as_mut() {
            Some(s) => Some(s.delete(id)?),
            None => None,
        };
        let mut acks = Vec::with_capacity(self.shards.len());
        for (s, h) in self.shards.iter().enumerate() {
            let (tx, rx) = flume::bounded(1);
            h.sender()
                .send(OwnerMsg::Delete { id, ack: tx })
                .map_err(|_| owner_gone(s))?;
            acks.push(rx);
        }
        Ok((existed, acks))
    }
}

fn owner_gone(shard: usize) -> Error {
    Error::Backend(format!("shard {shard}'s owner has stopped"))
}
