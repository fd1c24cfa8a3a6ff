//! The cache-aside side: no store behind the cache. Misses are the client's to fill
//! (FILL); writes only reach the shard owners, sequenced per id by the stripes so that
//! every owner sees one id's writes in the same order.

use std::time::Instant;

use super::{
    BackendAnswer, DeleteAcks, IdStripes, InsertAcks, NewRow, Owners, Position, Side, SideInfo,
};
use crate::protocol::Rejection;

pub(super) struct CacheAside {
    /// Per-id write order (the stripes hold nothing else here).
    order: IdStripes<()>,
}

impl CacheAside {
    pub(super) fn new() -> CacheAside {
        CacheAside {
            order: IdStripes::new(),
        }
    }
}

impl SideInfo for CacheAside {
    fn has_store(&self) -> bool {
        false
    }
}

impl Side for CacheAside {
    type Conn = ();

    fn connect(&self) -> Option<()> {
        Some(())
    }

    /// Never asked (no store: executors answer misses themselves, and no recall floor
    /// runs); an empty answer, never admitted.
    fn search(
        &self,
        _: &mut (),
        _q: &[f32],
        _n: usize,
        _deadline: Option<Instant>,
        _at_position: Position,
    ) -> Result<BackendAnswer, Rejection> {
        Ok(BackendAnswer {
            candidates: Vec::new(),
            complete: false,
        })
    }

    /// No position: the write is in every shard before it is acknowledged.
    fn insert(
        &self,
        _: &mut (),
        owners: &Owners,
        row: &NewRow,
    ) -> Result<(InsertAcks, Position), Rejection> {
        let _order = self.order.lock(row.id);
        Ok((owners.queue_insert(row.id, &row.vector, row.near)?, None))
    }

    fn delete(
        &self,
        _: &mut (),
        owners: &Owners,
        id: u64,
        _deadline: Option<Instant>,
    ) -> Result<(Option<bool>, DeleteAcks, Position), Rejection> {
        let _order = self.order.lock(id);
        Ok((None, owners.queue_delete(id)?, None))
    }
}
