//! A write's way through the durable store, as the embedded backend drives it:
//! logged under the store's write lock, made durable outside it, and a checkpoint
//! started once the log has grown past its size.
//!
//! ```text
//!  gate + store write lock { seq = log(op); store apply; queue to owners }
//!  made_durable(seq): wal.wait_durable(seq) (group commit) ─► checkpoint_due?
//!        └─ start_checkpoint: gate + store read lock { rotate; export; dump graph }
//!                             ─► checkpoint written on its own thread
//! ```

use std::io;
use std::sync::RwLock;

use shards::Backend;

use super::wal::Op;
use super::Durable;

impl Durable {
    /// Appends a write to the log; call it under the store's write lock, before the
    /// store applies it. Its sequence number, for [`Durable::made_durable`].
    pub(crate) fn log(&self, op: &Op) -> io::Result<u64> {
        self.wal.append(op)
    }

    /// Waits (outside the store's lock) until the write logged as `seq` is on stable
    /// storage, then starts a checkpoint of `store` if the log has grown past its size.
    pub(crate) fn made_durable(
        &self,
        seq: u64,
        store: &RwLock<Box<dyn Backend + Send + Sync>>,
    ) -> io::Result<()> {
        self.wal.wait_durable(seq)?;
        if self.checkpoint_due() {
            self.start_checkpoint(store);
        }
        Ok(())
    }

    /// Rotates the log, exports the rows and dumps an HNSW store's graph under the
    /// store's read lock (writes wait for it, searches do not), then writes the
    /// checkpoint on its own thread. Writers wait for the graph's dump too: it must be of
    /// the state the rows are: 1.21 s for 400k x 50 (bench/results/durable.md).
    pub(crate) fn start_checkpoint(&self, store: &RwLock<Box<dyn Backend + Send + Sync>>) {
        if !self.begin_checkpoint() {
            return;
        }
        let exported = {
            let _gate = self.gate.lock();
            let store = store.read().unwrap_or_else(|e| e.into_inner());
            match (self.wal.rotate(), store.export()) {
                (Ok(seq), Some(rows)) => {
                    let graph = self.dump_graph(seq, &**store);
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
                self.checkpoint(seq, dim, rows, graph);
            }
            None => self.abandon_checkpoint(),
        }
    }
}
