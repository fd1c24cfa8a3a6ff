//! The backend pool's pgvector side: each backend thread holds its own connection
//! (`PgConn`), so a search or write always has one; writes go through the in-doubt
//! protocol (`in_doubt.rs`) under their id's stripe.
//!
//! ```text
//!  thread i ── PgConn ──► search ──────────────► rows ─► BackendAnswer
//!                    └──► insert / delete ──► WriteOrder (stripe, settle, strip)
//!                                                └─ committed ─► queue to owners
//! ```

use std::sync::Arc;
use std::time::Instant;

use super::in_doubt::WriteOrder;
use super::{PgConn, PgTarget};
use crate::protocol::Rejection;
use crate::service::backend::{
    BackendAnswer, DeleteAcks, InsertAcks, NewRow, Owners, Side, SideInfo,
};

pub(crate) struct PgSide {
    target: Arc<PgTarget>,
    order: WriteOrder,
}

impl PgSide {
    pub(crate) fn new(target: Arc<PgTarget>) -> PgSide {
        PgSide {
            target,
            order: WriteOrder::new(),
        }
    }
}

impl SideInfo for PgSide {
    fn pgvector(&self) -> Option<&PgTarget> {
        Some(&self.target)
    }
}

impl Side for PgSide {
    type Conn = PgConn;

    fn connect(&self) -> Option<PgConn> {
        match PgConn::new(self.target.clone()) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!(error = %e, "backend thread: no runtime for pgvector");
                None
            }
        }
    }

    fn idle(&self, pg: &mut PgConn) {
        pg.reconnect_if_due(false);
    }

    fn search(
        &self,
        pg: &mut PgConn,
        q: &[f32],
        n: usize,
        deadline: Option<Instant>,
    ) -> Result<BackendAnswer, Rejection> {
        let a = pg.search(q, n, deadline)?;
        Ok(BackendAnswer {
            candidates: a.candidates,
            complete: a.complete,
        })
    }

    fn insert(
        &self,
        pg: &mut PgConn,
        owners: &Owners,
        row: &NewRow,
    ) -> Result<InsertAcks, Rejection> {
        self.order.write(
            pg,
            owners,
            row.id,
            |pg| pg.insert(row.id, &row.vector, &row.payload, row.deadline),
            |()| owners.queue_insert(row.id, &row.vector, row.near),
        )
    }

    fn delete(
        &self,
        pg: &mut PgConn,
        owners: &Owners,
        id: u64,
        deadline: Option<Instant>,
    ) -> Result<(Option<bool>, DeleteAcks), Rejection> {
        self.order.write(
            pg,
            owners,
            id,
            |pg| pg.delete(id, deadline),
            |existed| Ok((Some(existed), owners.queue_delete(id)?)),
        )
    }
}
