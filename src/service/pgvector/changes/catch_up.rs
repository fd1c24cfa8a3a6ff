//! A warm start in front of PostgreSQL: the snapshot on disk was taken at a stream
//! position; the slot still holds every change after it (its confirmed position is
//! never moved past the last snapshot's), so those changes are read now, up to the
//! flush position, and replayed into the restored shards before the first reply, as
//! the durable store replays its log. The snapshot is refused (a cold start, said in
//! the log) when the slot cannot replay from its position, or the database is another
//! one (system identifier, timeline, the table's OID: `collection_id`).

use std::time::Instant;

use futures_lite::StreamExt;
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

use super::super::pgoutput::{self, lsn_text, Lsn, Message};
use super::super::{open, runtime, PgTarget};
use super::decode::{Change, Decoder};
use super::setup;
use crate::config::PgvectorSection;
use crate::durable::wal::Op;
use crate::service::StartError;

/// The most changes a warm start replays; past it the cache starts cold (a replay that
/// long would hold the start, and its memory, longer than a cold cache costs).
const OPS_MAX: usize = 1_000_000;
/// How long a decoded transaction may stay invisible before the warm start gives up.
const VISIBLE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The database the snapshot's entries belong to: its system identifier, timeline and
/// the table's OID, hashed (a restored backup, a promoted replica, a table made anew
/// give another).
pub(crate) fn collection_id(target: &PgTarget) -> Result<u64, StartError> {
    let rt = runtime()?;
    rt.block_on(async {
        let c = open(&target.conn)
            .await
            .map_err(|e| StartError::Backend(e.to_string()))?;
        // pg_control_*() need pg_monitor (or superuser); without it the table's OID and
        // the server's start-up identity stand in (a restore then looks the same).
        let ids = c
            .query_one(
                "SELECT (SELECT system_identifier FROM pg_control_system())::text, \
                        (SELECT timeline_id FROM pg_control_checkpoint())::text",
                &[],
            )
            .await;
        let (system, timeline): (String, String) = match ids {
            Ok(r) => (r.get(0), r.get(1)),
            Err(e) => {
                tracing::warn!(error = %e, "pgvector: the server's system identifier is not readable \
                    (grant pg_monitor): a warm snapshot is matched by the table's OID only");
                (String::new(), String::new())
            }
        };
        let relid: u32 = c
            .query_one("SELECT to_regclass($1)::oid", &[&target.table])
            .await
            .map_err(|e| StartError::Backend(e.to_string()))?
            .get(0);
        let text = format!("pgvector|{system}|{timeline}|{relid}");
        Ok(xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
    })
}

/// The slot's changes after `from`, up to the flush position now, as the log's ops,
/// and that position. `Err`: why the snapshot cannot be used.
pub(crate) fn catch_up(
    target: &PgTarget,
    section: &PgvectorSection,
    instance: &str,
    from: Lsn,
) -> Result<(Vec<Op>, Lsn), String> {
    let rt = runtime().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let c = open(&target.conn).await.map_err(|e| e.to_string())?;
        let side = open(&target.conn).await.map_err(|e| e.to_string())?;
        for s in [&c, &side] {
            s.batch_execute("SET statement_timeout = '60s'")
                .await
                .map_err(|e| e.to_string())?;
            let _ = s.batch_execute(super::follow::CLIENT_CHECK).await;
        }
        let slot = super::slot_name(instance);
        // A peek of the akerd killed before this start may still hold the slot.
        setup::wait_slot_inactive(&c, &slot)
            .await
            .map_err(|e| e.to_string())?;
        check_slot(&c, &slot, from).await?;
        let relid: u32 = c
            .query_one("SELECT to_regclass($1)::oid", &[&target.table])
            .await
            .map_err(|e| e.to_string())?
            .get(0);
        let mut decoder = Decoder::new(
            relid,
            target.dim,
            &section.id_column,
            &section.vector_column,
        );
        let t = Instant::now();
        let (upto, mut snap) = setup::position(&side).await.map_err(|e| e.to_string())?;
        let rows = c
            .query_raw(
                "SELECT data FROM pg_logical_slot_peek_binary_changes($1::text::name, $2, NULL, \
                 'proto_version', '1', 'publication_names', $3::text)",
                [
                    &slot as &(dyn tokio_postgres::types::ToSql + Sync),
                    &PgLsn::from(upto),
                    &slot,
                ],
            )
            .await
            .map_err(|e| e.to_string())?;
        let mut rows = std::pin::pin!(rows);
        let (mut ops, mut changes, mut skip, mut last_end) = (Vec::new(), Vec::new(), false, 0);
        while let Some(row) = rows.next().await {
            let row = row.map_err(|e| e.to_string())?;
            let data: &[u8] = row.get(0);
            let m = pgoutput::decode(data).map_err(|e| e.to_string())?;
            match &m {
                Message::Begin { final_lsn, xid, .. } => {
                    skip = *final_lsn < from;
                    let until = Instant::now() + VISIBLE_WAIT;
                    while !skip && !snap.sees(snap.widen(*xid)) {
                        if Instant::now() >= until {
                            return Err(format!(
                                "transaction {xid} after it is still not visible after {VISIBLE_WAIT:?}"
                            ));
                        }
                        tokio::time::sleep(std::time::Duration::from_micros(200)).await;
                        snap = setup::position(&side).await.map_err(|e| e.to_string())?.1;
                    }
                }
                Message::Commit { end_lsn, .. } => {
                    last_end = *end_lsn;
                    skip = false;
                }
                Message::Relation(r) => decoder.relation(r)?,
                _ if skip => {}
                m => {
                    changes.clear();
                    decoder.changes(m, &mut changes)?;
                    for ch in changes.drain(..) {
                        match ch {
                            Change::Upsert { id, vector } => {
                                ops.push(Op::Delete { id });
                                ops.push(Op::Insert { id, vector });
                            }
                            Change::Delete { id } => ops.push(Op::Delete { id }),
                            Change::Flush => return Err("the table was truncated after it".into()),
                        }
                    }
                    if ops.len() > OPS_MAX {
                        return Err(format!("more than {OPS_MAX} changes after it"));
                    }
                }
            }
        }
        let to = upto.max(last_end);
        tracing::info!(from = %lsn_text(from), to = %lsn_text(to), changes = ops.len(),
            secs = t.elapsed().as_secs_f64(), "pgvector: the changes after the snapshot read");
        Ok((ops, to))
    })
}

/// The slot exists, is usable, and has not confirmed past `from`.
async fn check_slot(c: &Client, slot: &str, from: Lsn) -> Result<(), String> {
    let r = c
        .query_opt(
            "SELECT confirmed_flush_lsn, coalesce(wal_status, ''), invalidation_reason \
             FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()",
            &[&slot],
        )
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("slot {slot} is gone: its changes since the snapshot are lost"))?;
    let (confirmed, status, reason): (Option<PgLsn>, String, Option<String>) =
        (r.get(0), r.get(1), r.get(2));
    if status == "lost" || reason.is_some() {
        return Err(format!(
            "slot {slot} was invalidated ({})",
            reason.unwrap_or(status)
        ));
    }
    let confirmed = confirmed.map_or(0, u64::from);
    if confirmed > from {
        return Err(format!(
            "taken at {}, but slot {slot} has confirmed {}: the changes between are gone",
            lsn_text(from),
            lsn_text(confirmed)
        ));
    }
    Ok(())
}
