//! Before following: the server allows it (`wal_level`, the role's REPLICATION), the
//! table's replica identity names the id (else the application's UPDATEs and DELETEs
//! would fail once the table is published, or carry another key), one akerd per slot
//! (an advisory lock held by the follower's `ctl` connection), then the publication
//! and the slot, made if missing. `--drop-slot` removes both.

use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

use super::super::pgoutput::{lsn_text, Lsn};
use super::Snap;
use crate::config::PgvectorSection;
use crate::service::StartError;

/// The first key of akerd's advisory locks ("aker"); the second is the slot's hash.
const LOCK_CLASS: i32 = 0x616b_6572;
/// What a statement of the follower's sessions may take, put back after a longer one.
const SESSION_TIMEOUT: &str = "SET statement_timeout = '60s'";
/// How long start-up waits for another session to release the slot's lock.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// How long, with the lock held, a slot still in use is waited for: a killed akerd's
/// peek outlives its session until the server sees its client gone, which the
/// follower's sessions ask it to check every second (`client_connection_check_interval`).
const SLOT_BUSY_WAIT: Duration = Duration::from_secs(5);
/// Creating a slot waits for the transactions running now to end.
const CREATE_SLOT_TIMEOUT: &str = "10s";
/// Advancing a slot decodes the WAL it skips.
const ADVANCE_TIMEOUT: &str = "60s";
/// At a cold start, how long a transaction in progress at the start position may take
/// to become visible or be seen still running.
const START_SETTLE: Duration = Duration::from_secs(5);

/// Why akerd does not follow.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetupError {
    #[error("wal_level is {0:?}, not \"logical\": set wal_level = logical and restart PostgreSQL")]
    NotLogical(String),
    #[error("missing privilege: {0}")]
    Privilege(String),
    #[error("{0}")]
    ReplicaIdentity(String),
    #[error("slot {slot} is held by another akerd (server process {pid}); give this akerd another backend.pgvector.instance, or retire the other (akerd --drop-slot)")]
    Held { slot: String, pid: String },
    #[error("slot {slot} is in use by server process {pid} (not an akerd: this akerd holds the slot's lock), still after {SLOT_BUSY_WAIT:?}; see pg_stat_activity for that process")]
    SlotBusy { slot: String, pid: i32 },
    #[error("database: {0}")]
    Db(String),
    #[error("{0}")]
    Other(String),
}

impl SetupError {
    /// With `changes = "auto"`, akerd starts without following (loudly) rather than
    /// refusing; a slot another akerd holds is refused either way.
    pub(super) fn allows_auto(&self) -> bool {
        !matches!(self, SetupError::Held { .. } | SetupError::SlotBusy { .. })
    }
}

impl From<tokio_postgres::Error> for SetupError {
    fn from(e: tokio_postgres::Error) -> Self {
        match e.code() {
            Some(c) if *c == SqlState::INSUFFICIENT_PRIVILEGE => {
                SetupError::Privilege(db_message(&e))
            }
            _ => SetupError::Db(db_message(&e)),
        }
    }
}

pub(super) fn db_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => d.message().to_string(),
        None => e.to_string(),
    }
}

/// The server allows logical decoding and this role may create slots.
pub(super) async fn check_server(c: &Client) -> Result<(), SetupError> {
    let version: String = c
        .query_one("SELECT current_setting('server_version_num')", &[])
        .await?
        .get(0);
    if version.parse::<u32>().unwrap_or(0) < 170_000 {
        return Err(SetupError::Other(format!(
            "PostgreSQL {version} (server_version_num): following changes needs 17 or later \
             (pg_replication_slots.invalidation_reason)"
        )));
    }
    let level: String = c
        .query_one("SELECT current_setting('wal_level')", &[])
        .await?
        .get(0);
    if level != "logical" {
        return Err(SetupError::NotLogical(level));
    }
    let row = c
        .query_one(
            "SELECT current_user::text, rolsuper OR rolreplication FROM pg_roles \
             WHERE rolname = current_user",
            &[],
        )
        .await?;
    let (user, may): (String, bool) = (row.get(0), row.get(1));
    if !may {
        return Err(SetupError::Privilege(format!(
            "role {user} needs REPLICATION to read the change stream: ALTER ROLE {user} WITH REPLICATION"
        )));
    }
    let keep: String = c
        .query_one("SELECT current_setting('max_slot_wal_keep_size')", &[])
        .await?
        .get(0);
    if keep == "-1" {
        tracing::warn!(
            "pgvector: max_slot_wal_keep_size is unlimited (-1): while akerd is down its slot \
             keeps all WAL from its position, without bound, until the disk fills. Set \
             max_slot_wal_keep_size (docs/PGVECTOR.md, \"The change stream\")"
        );
    }
    Ok(())
}

/// The table's OID, once its replica identity is known to contain the id column.
pub(super) async fn check_table(
    c: &Client,
    table: &str,
    id_column: &str,
) -> Result<u32, SetupError> {
    let row = c
        .query_one(
            "SELECT c.oid, c.relreplident::text, c.relkind::text FROM pg_class c \
             WHERE c.oid = to_regclass($1)",
            &[&table],
        )
        .await?;
    let (relid, ident, kind): (u32, String, String) = (row.get(0), row.get(1), row.get(2));
    if kind != "r" {
        // A partitioned table's changes come under its partitions' OIDs.
        return Err(SetupError::Other(format!(
            "{table} is not a plain table (relkind {kind}): partitioned tables are not \
             followed yet"
        )));
    }
    let holds_id = match ident.as_str() {
        "f" => true,
        "n" => false,
        kind => c
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a \
                   ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) \
                 WHERE i.indrelid = $1 AND a.attname = $2 \
                   AND CASE $3 WHEN 'd' THEN i.indisprimary ELSE i.indisreplident END)",
                &[&relid, &id_column, &kind],
            )
            .await?
            .get(0),
    };
    if holds_id {
        return Ok(relid);
    }
    let index: Option<String> = c
        .query_opt(
            "SELECT i.indexrelid::regclass::text FROM pg_index i JOIN pg_attribute a \
               ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
             WHERE i.indrelid = $1 AND a.attname = $2 AND i.indisunique AND i.indnatts = 1 \
               AND i.indpred IS NULL AND i.indimmediate LIMIT 1",
            &[&relid, &id_column],
        )
        .await?
        .map(|r| r.get(0));
    let fix = match index {
        Some(ix) => format!("ALTER TABLE {table} REPLICA IDENTITY USING INDEX {ix}"),
        None => format!("ALTER TABLE {table} ADD PRIMARY KEY ({id_column})"),
    };
    Err(SetupError::ReplicaIdentity(format!(
        "the replica identity of {table} does not contain {id_column}: once published, its \
         UPDATEs and DELETEs would fail or not say which id they change. Nothing was \
         created. Fix: {fix}"
    )))
}

/// Takes the slot's advisory lock for the life of `c`'s session. A holder is waited
/// for up to [`LOCK_WAIT`]: an akerd killed and started again at once finds its old
/// server session still ending.
pub(super) async fn lock(c: &Client, slot: &str) -> Result<(), SetupError> {
    let until = Instant::now() + LOCK_WAIT;
    loop {
        let got: bool = c
            .query_one(
                "SELECT pg_try_advisory_lock($1, hashtext($2))",
                &[&LOCK_CLASS, &slot],
            )
            .await?
            .get(0);
        if got {
            return Ok(());
        }
        if Instant::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid: Option<i32> = c
        .query_opt(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
               AND classid = $1::int::oid AND objid = hashtext($2)::oid AND objsubid = 2 LIMIT 1",
            &[&LOCK_CLASS, &slot],
        )
        .await?
        .map(|r| r.get(0));
    Err(SetupError::Held {
        slot: slot.to_string(),
        pid: pid.map_or("unknown".into(), |p| p.to_string()),
    })
}

/// The publication `name` for `table` (made, or set to the table).
pub(super) async fn publication(c: &Client, name: &str, table: &str) -> Result<(), SetupError> {
    let exists: bool = c
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)",
            &[&name],
        )
        .await?
        .get(0);
    // An existing one is set again whole: the table alone, no row filter or column
    // list, every kind of change (someone may have altered it).
    let sql = match exists {
        true => format!(
            "ALTER PUBLICATION {name} SET TABLE {table}; \
             ALTER PUBLICATION {name} SET (publish = 'insert, update, delete, truncate')"
        ),
        false => format!(
            "CREATE PUBLICATION {name} FOR TABLE {table} \
             WITH (publish = 'insert, update, delete, truncate')"
        ),
    };
    c.batch_execute(&sql)
        .await
        .map_err(|e| match SetupError::from(e) {
            SetupError::Privilege(m) => SetupError::Privilege(format!(
                "{m}: publishing {table} needs its ownership and CREATE on the database"
            )),
            other => other,
        })?;
    tracing::info!(publication = name, table, "pgvector: publication ready");
    Ok(())
}

/// What the slot was found to be.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SlotFound {
    /// There, usable.
    Usable,
    /// Missing: made now.
    Made,
    /// Invalidated (WAL removed, idle timeout, ...): dropped and made anew.
    Remade(String),
}

/// Waits (at most [`SLOT_BUSY_WAIT`]) until no server process has slot `name` in use.
/// An akerd killed gives its lock up with its session, but a peek of the slot it had
/// running goes on until the server finds its client gone; an active slot can be
/// neither read nor dropped. With the lock held (start, reconnect, `--drop-slot`) nobody
/// takes the slot meanwhile; without it (a warm start's catch-up) an akerd following it
/// shows as busy.
pub(super) async fn wait_slot_inactive(c: &Client, name: &str) -> Result<(), SetupError> {
    let until = Instant::now() + SLOT_BUSY_WAIT;
    loop {
        let pid: Option<i32> = c
            .query_opt(
                "SELECT active_pid FROM pg_replication_slots \
                 WHERE slot_name = $1 AND database = current_database()",
                &[&name],
            )
            .await?
            .and_then(|r| r.get(0));
        let Some(pid) = pid else { return Ok(()) };
        if Instant::now() >= until {
            return Err(SetupError::SlotBusy {
                slot: name.to_string(),
                pid,
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The slot `name`, made if missing or lost; one still in use by a process ending is
/// waited for ([`wait_slot_inactive`]).
pub(super) async fn slot(c: &Client, name: &str) -> Result<SlotFound, SetupError> {
    wait_slot_inactive(c, name).await?;
    let row = c
        .query_opt(
            "SELECT coalesce(wal_status, ''), invalidation_reason, active_pid \
             FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()",
            &[&name],
        )
        .await?;
    let found = match row {
        None => SlotFound::Made,
        Some(r) => {
            let (status, reason, active): (String, Option<String>, Option<i32>) =
                (r.get(0), r.get(1), r.get(2));
            if let Some(pid) = active {
                return Err(SetupError::Held {
                    slot: name.to_string(),
                    pid: pid.to_string(),
                });
            }
            if status != "lost" && reason.is_none() {
                return Ok(SlotFound::Usable);
            }
            c.execute("SELECT pg_drop_replication_slot($1)", &[&name])
                .await?;
            SlotFound::Remade(reason.unwrap_or(status))
        }
    };
    create_slot(c, name).await?;
    Ok(found)
}

async fn create_slot(c: &Client, name: &str) -> Result<(), SetupError> {
    c.batch_execute(&format!("SET statement_timeout = '{CREATE_SLOT_TIMEOUT}'"))
        .await?;
    let made = c
        .query_one(
            "SELECT lsn FROM pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&name],
        )
        .await;
    c.batch_execute(SESSION_TIMEOUT).await?;
    match made {
        Ok(_) => {
            tracing::info!(slot = name, "pgvector: replication slot made");
            Ok(())
        }
        Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => Err(SetupError::Other(format!(
            "making slot {name} waits for the transactions running now to end, and one has \
             been open for over {CREATE_SLOT_TIMEOUT}: find it in pg_stat_activity (xact_start)"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// The WAL's flush position and a snapshot, read at one instant.
pub(super) async fn position(c: &Client) -> Result<(Lsn, Snap), tokio_postgres::Error> {
    let r = c
        .query_one(
            "SELECT pg_current_wal_flush_lsn(), pg_snapshot_xmin(s)::text::bigint, \
               pg_snapshot_xmax(s)::text::bigint, \
               ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(s) x) \
             FROM pg_current_snapshot() s",
            &[],
        )
        .await?;
    let snap = Snap {
        xmin: r.get::<_, i64>(1) as u64,
        xmax: r.get::<_, i64>(2) as u64,
        xip: r
            .get::<_, Vec<i64>>(3)
            .into_iter()
            .map(|x| x as u64)
            .collect(),
    };
    Ok((u64::from(r.get::<_, PgLsn>(0)), snap))
}

/// A cold cache needs none of the slot's past: the slot advanced to the flush position.
/// A transaction committed just before it may not be visible yet; the cache admits
/// nothing before each one running at that instant is visible or still running
/// (its commit then comes later, in the stream).
pub(super) async fn cold_start(c: &Client, slot: &str) -> Result<Lsn, SetupError> {
    let (at, _) = position(c).await?;
    // Taken after `at` was read: a transaction committed before `at` has ended there or
    // is still in its list (committed, not yet visible); one that began later is past
    // its xmax and commits later than `at`.
    let (_, snap) = position(c).await?;
    c.batch_execute(&format!("SET statement_timeout = '{ADVANCE_TIMEOUT}'"))
        .await?;
    let advanced = c
        .execute(
            "SELECT pg_replication_slot_advance($1, $2)",
            &[&slot, &PgLsn::from(at)],
        )
        .await;
    c.batch_execute(SESSION_TIMEOUT).await?;
    if let Err(e) = advanced {
        if e.code() != Some(&SqlState::QUERY_CANCELED) {
            return Err(e.into());
        }
        // Too much WAL to skip in time: a new slot starts here.
        tracing::warn!(
            slot,
            "pgvector: advancing the slot took too long; making it anew"
        );
        c.execute("SELECT pg_drop_replication_slot($1)", &[&slot])
            .await?;
        create_slot(c, slot).await?;
        return Box::pin(cold_start(c, slot)).await;
    }
    settle_running(c, &snap).await?;
    tracing::info!(slot, at = %lsn_text(at), "pgvector: following the table's changes from here");
    Ok(at)
}

/// Waits until each transaction `snap` saw running is visible, or is found still
/// running after the flush position was read (then its commit is later than it).
async fn settle_running(c: &Client, snap: &Snap) -> Result<(), SetupError> {
    let until = Instant::now() + START_SETTLE;
    for &x in &snap.xip {
        loop {
            let r = c
                .query_one(
                    "SELECT pg_visible_in_snapshot($1::text::xid8, pg_current_snapshot()), \
                            coalesce(pg_xact_status($1::text::xid8), '')",
                    &[&(x as i64).to_string()],
                )
                .await?;
            let (visible, status): (bool, String) = (r.get(0), r.get(1));
            // Only a committed transaction still invisible is waited for (in progress:
            // its commit comes later, in the stream; aborted or too old: nothing to see).
            if visible || status != "committed" {
                break;
            }
            if Instant::now() >= until {
                return Err(SetupError::Other(format!(
                    "transaction {x} committed before the stream's start position is still \
                     not visible after {START_SETTLE:?} (a synchronous standby away?)"
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    Ok(())
}

/// `akerd --drop-slot`: removes this akerd's slot and publication (an operator retiring
/// it: the slot would otherwise hold WAL forever).
pub(crate) fn drop_slot(section: &PgvectorSection, instance: &str) -> Result<String, StartError> {
    let conn = super::super::discover::connection_config(section)?;
    let name = super::slot_name(instance);
    let rt = super::super::runtime()?;
    rt.block_on(async {
        let c = super::super::open(&conn)
            .await
            .map_err(|e| StartError::Backend(e.to_string()))?;
        let fail = |e: tokio_postgres::Error| StartError::Backend(db_message(&e));
        // Not under an akerd still running with it (its follower holds the lock; one
        // just killed is given LOCK_WAIT for its session to end).
        if let Err(e) = lock(&c, &name).await {
            return Err(match e {
                SetupError::Held { pid, .. } => StartError::Backend(format!(
                    "an akerd still runs with slot {name} (server process {pid}): stop it first"
                )),
                other => StartError::Backend(other.to_string()),
            });
        }
        if let Err(e) = wait_slot_inactive(&c, &name).await {
            return Err(StartError::Backend(e.to_string()));
        }
        let dropped = c
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND database = current_database()",
                &[&name],
            )
            .await
            .map_err(fail)?;
        c.batch_execute(&format!("DROP PUBLICATION IF EXISTS {name}"))
            .await
            .map_err(fail)?;
        Ok(match dropped {
            0 => format!("no slot {name}; publication {name} dropped if it was there"),
            _ => format!("slot {name} and publication {name} dropped"),
        })
    })
}
