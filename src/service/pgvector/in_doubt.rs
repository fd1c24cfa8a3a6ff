//! Writes whose commit is in doubt, in one place: the connection was lost, or no answer
//! came, around a write's COMMIT, so the database may or may not hold it.
//!
//! ```text
//!  write to id ─► lock id's stripe ─► stripe holds an unsettled session?
//!                   │                    └─ settle it (end it, wait until gone);
//!                   │                       cannot: UNAVAILABLE, nothing sent
//!                   ▼
//!                 statement ─► ok ─────────────► queue to the shard owners
//!                   │ in doubt
//!                   ├─ settle its own session; cannot: the stripe keeps it
//!                   └─ strip id from every shard, then answer the error
//! ```
//!
//! The cache never serves a row the database may have dropped or replaced, and a write
//! in doubt cannot commit after a later write to the same id (its server session is
//! ended first). A write the database rolled back, or that was never sent, changes
//! nothing and is answered as it is.

use std::time::{Duration, Instant};

use super::conn::{FailKind, Failure, PgConn};
use super::{open, PgStats};
use crate::protocol::{Rejection, Status};
use crate::service::backend::{IdStripes, Owners};

/// How long a write in doubt waits for its old server session to be gone.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// How long a failed write waits for the owners to strip its id before answering.
const STRIP_WAIT: Duration = Duration::from_secs(5);

/// A server session: its process id and start time (a pid alone may be reused once
/// the process has exited).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Session {
    pub pid: i32,
    pub started: String,
}

/// A write that failed; `in_doubt`: it may have committed (the caller must not trust
/// either outcome); `unsettled`: and its server session could not be confirmed gone,
/// so it might still commit: writes to the same id must wait until it is.
pub(crate) struct WriteError {
    pub rejection: Rejection,
    pub in_doubt: bool,
    pub unsettled: Option<Session>,
}

impl From<Failure> for WriteError {
    fn from(f: Failure) -> Self {
        WriteError {
            in_doubt: matches!(f.kind, FailKind::Gone | FailKind::NoAnswer),
            rejection: f.rejection,
            unsettled: None,
        }
    }
}

/// A write refused before anything was sent.
pub(super) fn not_sent(rejection: Rejection) -> WriteError {
    WriteError {
        rejection,
        in_doubt: false,
        unsettled: None,
    }
}

impl PgConn {
    /// A failed write's pipeline: in doubt, its session is settled before returning
    /// (a lost connection's and one that gave no answer alike).
    pub(super) fn write_failed(&mut self, f: Failure) -> WriteError {
        let doubt = matches!(f.kind, FailKind::Gone | FailKind::NoAnswer);
        let session = f.session.clone().filter(|_| doubt);
        let mut e = WriteError::from(f);
        if doubt {
            PgStats::bump(&self.target.stats.writes_in_doubt);
        }
        if let Some(s) = session {
            if !self.settle(&s) {
                PgStats::bump(&self.target.stats.writes_unsettled);
                e.unsettled = Some(s);
            }
        }
        e
    }

    /// A write's outcome is in doubt and its server session may still be running it
    /// (`pid`): end that session from a new connection and wait until it is gone, so
    /// the write cannot commit after a later write to the same id (the caller holds the
    /// id's stripe). Bounded by [`SETTLE_WAIT`]; false when it could not be confirmed
    /// (the database unreachable: counted and logged).
    pub(crate) fn settle(&mut self, session: &Session) -> bool {
        let t = &*self.target;
        let (pid, started) = (session.pid, session.started.as_str());
        let work = async {
            let c = open(&t.conn).await?;
            c.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE pid = $1 AND backend_start::text = $2",
                &[&pid, &started],
            )
            .await?;
            loop {
                let n: i64 = c
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity \
                         WHERE pid = $1 AND backend_start::text = $2",
                        &[&pid, &started],
                    )
                    .await?
                    .get(0);
                if n == 0 {
                    return Ok::<(), tokio_postgres::Error>(());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let settled = matches!(
            self.rt
                .block_on(async { tokio::time::timeout(SETTLE_WAIT, work).await }),
            Ok(Ok(()))
        );
        if !settled {
            tracing::error!(
                pid,
                "pgvector: a write in doubt is not settled yet: its session may still \
                 commit it; writes to ids of its stripe wait until it is gone"
            );
        }
        settled
    }
}

/// pgvector's per-id write order: writes to different ids run in parallel; a stripe
/// holds the server session of a write in doubt that could not be confirmed gone, and
/// writes to its ids wait (UNAVAILABLE) until it is.
pub(super) struct WriteOrder {
    stripes: IdStripes<Option<Session>>,
}

impl WriteOrder {
    pub(super) fn new() -> WriteOrder {
        WriteOrder {
            stripes: IdStripes::new(),
        }
    }

    /// A write to `id`: `statement` on `pg` under the id's stripe, then, committed,
    /// `queue` (to the shard owners) still under it, so every owner sees the writes to
    /// one id in the database's order. A failure in doubt strips `id` first.
    pub(super) fn write<W, T>(
        &self,
        pg: &mut PgConn,
        owners: &Owners,
        id: u64,
        statement: impl FnOnce(&mut PgConn) -> Result<W, WriteError>,
        queue: impl FnOnce(W) -> Result<T, Rejection>,
    ) -> Result<T, Rejection> {
        let mut stripe = self.stripes.lock(id);
        settle_stripe(&mut stripe, pg, id)?;
        match statement(pg) {
            Ok(w) => queue(w),
            Err(e) => {
                *stripe = e.unsettled.clone();
                Err(after_failed_write(owners, id, e))
            }
        }
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

/// A write that failed. Rolled back or never sent: nothing changed, the error is
/// answered as it is. In doubt (the connection was lost, or no answer came, around
/// the commit; its server session has been ended by then): `id` is stripped from
/// every shard first (harmless if the row is still there: its entries promote a
/// reserve), so the cache cannot keep serving a version of the row the database
/// may no longer hold.
fn after_failed_write(owners: &Owners, id: u64, e: WriteError) -> Rejection {
    if !e.in_doubt {
        return e.rejection;
    }
    match strip(owners, id) {
        Ok(()) => e.rejection,
        Err(gone) => gone,
    }
}

/// `id` out of every shard, each owner's acknowledgement awaited up to [`STRIP_WAIT`]
/// (a write in doubt, or one committed that the change stream has not applied yet).
pub(super) fn strip(owners: &Owners, id: u64) -> Result<(), Rejection> {
    let acks = owners.queue_delete(id)?;
    let until = Instant::now() + STRIP_WAIT;
    for a in acks {
        if a.recv_deadline(until).is_err() {
            tracing::warn!(id, "a shard did not confirm stripping a write's id");
        }
    }
    Ok(())
}
