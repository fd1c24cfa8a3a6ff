//! Messages to a shard's owner, and the handle other cores hold.
//!
//! ```text
//!   reader core ── lookup (lock-free) ──► hit ── LinkAlias / SlowPathCredit ──┐ try_send:
//!                                       └ miss ─ backend ─ Admit ─────────────┤ dropped and
//!                                                                             │ counted if full
//!   writer ─────── Insert / Delete (ack after applied) ─── send (waits) ──────┤
//!                                                                             ▼
//!                                              bounded channel ──► owner: Cache::apply
//! ```
//!
//! Hints (alias links, slow-path credit, admissions) are optional work: when the queue
//! is full they are dropped and counted, never waited for. Inserts and deletes must
//! arrive: their senders wait for room, and for the acknowledgement.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::backend::Candidate;
use crate::cache::{Admission, Cache, DeleteOutcome};
use crate::counter::Counter;
use crate::entry::RepId;
use crate::error::Result;
use crate::exact_table::QueryKey;
use crate::read::{CacheReader, MissTicket};
use crate::refresh::InsertOutcome;

pub enum OwnerMsg {
    LinkAlias {
        key: QueryKey,
        rep: RepId,
    },
    SlowPathCredit,
    /// A hit found this entry behind the insert log (`Hit::catch_up`,
    /// `MissTicket::catch_up`): scan its records now (`Cache::catch_up`).
    CatchUp {
        rep: RepId,
    },
    Admit {
        ticket: MissTicket,
        answer: Vec<Candidate>,
        ack: Option<flume::Sender<Admission>>,
    },
    Insert {
        id: u64,
        vector: Arc<[f32]>,
        fast_path: bool,
        ack: flume::Sender<Result<InsertOutcome>>,
    },
    Delete {
        id: u64,
        ack: flume::Sender<DeleteOutcome>,
    },
    Flush {
        ack: flume::Sender<()>,
    },
    /// The shard's warm-restart image (`snapshot.rs`), as of every message before it.
    Export {
        ack: flume::Sender<crate::snapshot::ShardImage>,
    },
}

/// What any core holds for a shard: its read side and its owner's queue.
#[derive(Clone)]
pub struct ShardHandle {
    pub reader: Arc<CacheReader>,
    tx: flume::Sender<OwnerMsg>,
    dropped: Arc<Counter>,
}

impl ShardHandle {
    /// Sends optional work; false (and counted) when the queue is full or closed.
    pub fn hint(&self, msg: OwnerMsg) -> bool {
        let ok = self.tx.try_send(msg).is_ok();
        if !ok {
            self.dropped.bump();
        }
        ok
    }

    /// Asks the owner for slow-path steps; at most one credit is queued at a time.
    pub fn slow_path_credit(&self) {
        if !self.reader.credit_pending.swap(true, Ordering::AcqRel)
            && !self.hint(OwnerMsg::SlowPathCredit)
        {
            self.reader.credit_pending.store(false, Ordering::Release);
        }
    }

    /// Asks the owner to catch `rep` up (a lookup's `Hit::catch_up` or
    /// `MissTicket::catch_up`); when the queue is full, the next hit asks again.
    pub fn catch_up(&self, rep: Option<RepId>) {
        if let Some(rep) = rep {
            if !self.hint(OwnerMsg::CatchUp { rep }) {
                self.reader.catch_up_dropped(rep);
            }
        }
    }

    /// The queue itself, for messages that must arrive (`send` / `send_async`).
    pub fn sender(&self) -> &flume::Sender<OwnerMsg> {
        &self.tx
    }

    /// Hints dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    pub fn queue_len(&self) -> usize {
        self.tx.len()
    }
}

/// A bounded queue to `cache`'s owner.
pub fn channel(cache: &Cache, depth: usize) -> (ShardHandle, flume::Receiver<OwnerMsg>) {
    let (tx, rx) = flume::bounded(depth.max(1));
    (
        ShardHandle {
            reader: cache.reader(),
            tx,
            dropped: Arc::new(Counter::default()),
        },
        rx,
    )
}

impl Cache {
    /// Applies one message (the owner's loop calls this).
    pub fn apply(&mut self, msg: OwnerMsg) {
        match msg {
            OwnerMsg::LinkAlias { key, rep } => {
                self.link_alias(key, rep);
            }
            OwnerMsg::CatchUp { rep } => {
                self.catch_up(rep);
            }
            OwnerMsg::SlowPathCredit => {
                self.read.credit_pending.store(false, Ordering::Release);
                self.run_slow_path();
            }
            OwnerMsg::Admit {
                ticket,
                answer,
                ack,
            } => {
                let a = self.admit(ticket, answer).unwrap_or(Admission::TooFew);
                self.run_slow_path();
                if let Some(ack) = ack {
                    let _ = ack.send(a);
                }
            }
            OwnerMsg::Insert {
                id,
                vector,
                fast_path,
                ack,
            } => {
                let _ = ack.send(self.insert_with(id, vector, fast_path));
            }
            OwnerMsg::Delete { id, ack } => {
                let _ = ack.send(self.delete(id));
            }
            OwnerMsg::Flush { ack } => {
                self.flush();
                let _ = ack.send(());
            }
            OwnerMsg::Export { ack } => {
                let _ = ack.send(self.export_image());
            }
        }
    }
}
