//! The backend pool's pgvector side: each backend thread holds its own connection
//! (`PgConn`), so a search or write always has one, and its connections to the read
//! replicas (`Standbys`, none without `replica_urls`); writes go through the in-doubt
//! protocol (`in_doubt.rs`) under their id's stripe.
//!
//! ```text
//!  thread i ── PgThread ──► search ── a replica that may, else PgConn ─► BackendAnswer
//!                      └──► insert / delete (PgConn) ──► WriteOrder (stripe, settle, strip)
//!                                  position noted for the replicas ─┘
//!                                                └─ committed ─► queue to owners
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::changes::Waited;
use super::in_doubt::{strip, WriteError, WriteOrder};
use super::pgoutput::{lsn_text, Lsn};
use super::replica::{self, Standbys};
use super::{PgConn, PgTarget};
use crate::protocol::{Rejection, Status};
use crate::service::backend::{
    BackendAnswer, DeleteAcks, InsertAcks, NewRow, Owners, Position, Side, SideInfo,
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

/// One backend thread's connections: the primary's, and one per read replica.
pub(crate) struct PgThread {
    pg: PgConn,
    standbys: Standbys,
}

/// Longest wait of a write without a deadline for the change stream to apply it.
const APPLY_WAIT: Duration = Duration::from_secs(5);

impl PgSide {
    /// A committed write reaches the cache. While akerd follows the table's changes, it
    /// comes from the stream, in commit order with everyone else's: the write waits
    /// until the stream has applied past `at` (the WAL position after its commit).
    /// Otherwise `direct` queues it to the owners (under the id's stripe).
    fn reach_cache<A: Default>(
        &self,
        owners: &Owners,
        id: u64,
        at: Option<Lsn>,
        deadline: Option<Instant>,
        direct: impl FnOnce() -> Result<A, Rejection>,
    ) -> Result<A, Rejection> {
        let feed = &self.target.changes;
        if !feed.following() {
            return direct();
        }
        let Some(at) = at else {
            // Committed, its position unread (the connection went right after): the id
            // leaves the cache, and the write is answered as one in doubt (the stream
            // may still re-apply an older write of the id before reaching this one).
            let _ = strip(owners, id);
            return Err(Rejection::new(
                Status::Unavailable,
                format!("committed, but its position was not read; id {id} is out of the cache"),
            ));
        };
        if feed.reconnecting() {
            // The stream cannot get there before the database is back: no 5 s wait.
            let _ = strip(owners, id);
            return Err(Rejection::new(
                Status::Unavailable,
                format!(
                    "committed (WAL {}), but the change stream is reconnecting; id {id} is \
                     out of the cache until it has applied it",
                    lsn_text(at)
                ),
            ));
        }
        let cap = Instant::now() + APPLY_WAIT;
        match feed.wait_applied(at, deadline.map_or(cap, |d| d.min(cap))) {
            Waited::Applied => Ok(A::default()),
            Waited::NotFollowing => direct(),
            Waited::TimedOut => {
                let _ = strip(owners, id);
                Err(Rejection::new(
                    Status::Unavailable,
                    format!(
                        "committed (WAL {}), but the change stream has not applied it yet; \
                         id {id} is out of the cache until it has",
                        lsn_text(at)
                    ),
                ))
            }
        }
    }
}

impl PgSide {
    /// A write's outcome (`at`: its position, `None` when unread), noted for the read
    /// replicas before the write reaches the cache or its id leaves it: a replica must
    /// have replayed it before answering a miss. One in doubt may have committed where
    /// no one knows.
    fn noted<T>(
        &self,
        r: Result<T, WriteError>,
        at: impl FnOnce(&T) -> Option<Lsn>,
    ) -> Result<T, WriteError> {
        let replicas = &self.target.replicas;
        match &r {
            Ok(done) => replicas.wrote(at(done)),
            Err(e) if e.in_doubt => replicas.position_unknown(),
            Err(_) => {}
        }
        r
    }
}

impl SideInfo for PgSide {
    fn pgvector(&self) -> Option<&PgTarget> {
        Some(&self.target)
    }
}

impl Side for PgSide {
    type Conn = PgThread;

    fn connect(&self) -> Option<PgThread> {
        match PgConn::new(self.target.clone()) {
            Ok(pg) => Some(PgThread {
                standbys: Standbys::new(self.target.clone(), &pg.rt),
                pg,
            }),
            Err(e) => {
                tracing::error!(error = %e, "backend thread: no runtime for pgvector");
                None
            }
        }
    }

    fn idle(&self, t: &mut PgThread) {
        t.pg.reconnect_if_due(false);
        t.standbys.idle(&t.pg.rt);
    }

    fn search(
        &self,
        t: &mut PgThread,
        q: &[f32],
        n: usize,
        deadline: Option<Instant>,
        at_position: Option<Lsn>,
    ) -> Result<BackendAnswer, Rejection> {
        let a = replica::search(&mut t.pg, &mut t.standbys, q, n, deadline, at_position)?;
        Ok(BackendAnswer {
            candidates: a.candidates,
            complete: a.complete,
        })
    }

    fn insert(
        &self,
        t: &mut PgThread,
        owners: &Owners,
        row: &NewRow,
    ) -> Result<(InsertAcks, Position), Rejection> {
        self.order.write(
            &mut t.pg,
            owners,
            row.id,
            |pg| {
                let r = pg.insert(row.id, &row.vector, &row.payload, row.deadline);
                self.noted(r, |&at| at)
            },
            |at| {
                let acks = self.reach_cache(owners, row.id, at, row.deadline, || {
                    owners.queue_insert(row.id, &row.vector, row.near)
                })?;
                Ok((acks, at))
            },
        )
    }

    fn delete(
        &self,
        t: &mut PgThread,
        owners: &Owners,
        id: u64,
        deadline: Option<Instant>,
    ) -> Result<(Option<bool>, DeleteAcks, Position), Rejection> {
        self.order.write(
            &mut t.pg,
            owners,
            id,
            |pg| match i64::try_from(id) {
                Ok(_) => self.noted(pg.delete(id, deadline), |&(_, at)| at),
                // No such row can exist: nothing was sent.
                Err(_) => pg.delete(id, deadline),
            },
            |(existed, at)| {
                let acks =
                    self.reach_cache(owners, id, at, deadline, || owners.queue_delete(id))?;
                Ok((Some(existed), acks, at))
            },
        )
    }
}
