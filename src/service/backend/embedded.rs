//! The embedded store side: an HNSW or exact store in this process, under an `RwLock`
//! (hnsw_rs needs `&mut` for our tombstone bookkeeping): a write holds it alone, from
//! the store's apply until the owners have its message; searches share it.
//!
//! ```text
//!  write:  [durable: gate] + write lock { validate; log (durable); apply; queue to owners }
//!          made durable (group commit, outside the lock) ─► acknowledged
//!  search: read lock { store.search }
//! ```
//!
//! With `backend.data_dir` the store is durable: its log and checkpoints are
//! `crate::durable`'s work, which this side only calls.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use super::{
    BackendAnswer, DeleteAcks, InsertAcks, NewRow, Owners, Position, Side, SideInfo, Store,
};
use crate::durable::wal::Op;
use crate::durable::Durable;
use crate::protocol::{Rejection, Status};

pub(super) struct Embedded {
    store: RwLock<Store>,
    /// The store's log and checkpoints (`backend.data_dir`).
    durable: Option<Arc<Durable>>,
    /// The store's live rows, kept by its writers: metrics read it on executors, which
    /// must never wait for the store's lock.
    rows: AtomicUsize,
}

impl Embedded {
    pub(super) fn new(store: RwLock<Store>, durable: Option<Arc<Durable>>) -> Embedded {
        let rows = store.read().unwrap_or_else(|e| e.into_inner()).len();
        Embedded {
            store,
            durable,
            rows: AtomicUsize::new(rows),
        }
    }

    /// Appends a write to the log (durable store only), under the store's write lock.
    fn log(&self, op: impl FnOnce() -> Op) -> Result<Option<u64>, Rejection> {
        let Some(d) = &self.durable else {
            return Ok(None);
        };
        d.log(&op()).map(Some).map_err(log_failed)
    }

    /// Waits (outside the store's lock) until the write logged as `seq` is on stable
    /// storage; may start a checkpoint.
    fn made_durable(&self, seq: Option<u64>) -> Result<(), Rejection> {
        let (Some(d), Some(seq)) = (&self.durable, seq) else {
            return Ok(());
        };
        d.made_durable(seq, &self.store).map_err(log_failed)
    }
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

impl SideInfo for Embedded {
    fn store_len(&self) -> Option<usize> {
        Some(self.rows.load(Ordering::Relaxed))
    }
}

impl Side for Embedded {
    type Conn = ();

    fn connect(&self) -> Option<()> {
        Some(())
    }

    fn search(
        &self,
        _: &mut (),
        q: &[f32],
        n: usize,
        _deadline: Option<Instant>,
        _at_position: Position,
    ) -> Result<BackendAnswer, Rejection> {
        let store = self.store.read().unwrap_or_else(|e| e.into_inner());
        let candidates = store.search(q, n)?;
        // The embedded stores return min(n, live rows): complete either way.
        Ok(BackendAnswer {
            candidates,
            complete: true,
        })
    }

    /// No position: the write is in every shard before it is acknowledged.
    fn insert(
        &self,
        _: &mut (),
        owners: &Owners,
        row: &NewRow,
    ) -> Result<(InsertAcks, Position), Rejection> {
        let (id, vector) = (row.id, &row.vector);
        let (acks, seq) = {
            let _gate = self.durable.as_ref().map(|d| d.gate.lock());
            let mut store = self.store.write().unwrap_or_else(|e| e.into_inner());
            // Refused before it is logged: a logged write is one recovery applies.
            shards::error::validate_vector(vector, store.dim())?;
            let op = || Op::Insert {
                id,
                vector: vector.to_vec(),
            };
            let seq = self.log(op)?;
            store.insert(id, vector)?;
            self.rows.store(store.len(), Ordering::Relaxed);
            (owners.queue_insert(id, vector, row.near)?, seq)
        };
        self.made_durable(seq)?;
        Ok((acks, None))
    }

    fn delete(
        &self,
        _: &mut (),
        owners: &Owners,
        id: u64,
        _deadline: Option<Instant>,
    ) -> Result<(Option<bool>, DeleteAcks, Position), Rejection> {
        let (existed, acks, seq) = {
            let _gate = self.durable.as_ref().map(|d| d.gate.lock());
            let mut store = self.store.write().unwrap_or_else(|e| e.into_inner());
            // Nothing to log for an id the store does not hold, but the answer
            // ("not there") rests on the writes logged before: it waits for them.
            let seq = match (store.contains(id), &self.durable) {
                (Some(false), Some(d)) => Some(d.wal.written()),
                _ => self.log(|| Op::Delete { id })?,
            };
            let existed = store.delete(id)?;
            self.rows.store(store.len(), Ordering::Relaxed);
            (existed, owners.queue_delete(id)?, seq)
        };
        self.made_durable(seq)?;
        Ok((Some(existed), acks, None))
    }

    fn gone(&self, served: &[u64]) -> Vec<u64> {
        let store = self.store.read().unwrap_or_else(|e| e.into_inner());
        served
            .iter()
            .copied()
            .filter(|&id| store.contains(id) == Some(false))
            .collect()
    }
}
