//! The cluster's tables in PostgreSQL and joining them. Every statement names the
//! schema from `cluster.schema`; the role needs `CREATE` on the database the first time.
//!
//! ```text
//!  routing(cluster, version)  centroids (f32 LE), metric, dim, fingerprint: one row per
//!                             version; version 1 by the first node, later ones by a retrain
//!  nodes(cluster, node_id)    advertise, slot, lease_until, renewals, load (f32 LE per
//!                             centroid: searches/s), started_at
//!  balance(cluster)           epoch, overrides (u32 centroid, u64 node, LE), by whom
//! ```

use tokio_postgres::Client;

use crate::protocol::ClusterReply;

/// Tables of one schema.
pub(crate) struct Tables {
    pub(crate) schema: String,
}

impl Tables {
    pub(crate) fn routing(&self) -> String {
        format!("{}.routing", self.schema)
    }
    pub(crate) fn nodes(&self) -> String {
        format!("{}.nodes", self.schema)
    }
    pub(crate) fn balance(&self) -> String {
        format!("{}.balance", self.schema)
    }

    fn ddl(&self) -> String {
        let s = &self.schema;
        format!(
            "CREATE SCHEMA IF NOT EXISTS {s};
             CREATE TABLE IF NOT EXISTS {s}.routing (
               cluster text NOT NULL, version bigint NOT NULL, fingerprint text NOT NULL,
               metric text NOT NULL, dim integer NOT NULL, centroids bytea NOT NULL,
               published_by bigint NOT NULL, published_at timestamptz NOT NULL DEFAULT now(),
               PRIMARY KEY (cluster, version));
             CREATE TABLE IF NOT EXISTS {s}.nodes (
               cluster text NOT NULL, node_id bigint NOT NULL, advertise text NOT NULL,
               slot text NOT NULL, started_at timestamptz NOT NULL DEFAULT now(),
               lease_until timestamptz NOT NULL, renewals bigint NOT NULL DEFAULT 0,
               load bytea NOT NULL DEFAULT '\\x',
               PRIMARY KEY (cluster, node_id));
             CREATE TABLE IF NOT EXISTS {s}.balance (
               cluster text PRIMARY KEY, epoch bigint NOT NULL, overrides bytea NOT NULL,
               published_by bigint NOT NULL, published_at timestamptz NOT NULL DEFAULT now());"
        )
    }
}

/// The lines of the two fingerprints that differ, each side's.
fn mismatch(j: &Joining<'_>, theirs: &str) -> JoinError {
    let only = |a: &str, b: &str| {
        let other: std::collections::HashSet<&str> = b.lines().collect();
        let d: Vec<&str> = a.lines().filter(|l| !other.contains(l)).collect();
        if d.is_empty() {
            "(nothing)".to_string()
        } else {
            d.join(", ")
        }
    };
    JoinError::Mismatch {
        name: j.name.into(),
        theirs: only(theirs, j.fingerprint),
        ours: only(j.fingerprint, theirs),
    }
}

/// Who is joining, with what.
pub(crate) struct Joining<'a> {
    pub(crate) name: &'a str,
    pub(crate) node_id: u64,
    pub(crate) advertise: &'a str,
    pub(crate) slot: &'a str,
    pub(crate) lease_ms: u64,
    pub(crate) fingerprint: &'a str,
    pub(crate) metric: shards::Metric,
    pub(crate) dim: usize,
    /// This node's own centroids: published when the cluster has none yet.
    pub(crate) centroids: &'a [f32],
}

/// The cluster's centroids as found (or published) at join.
pub(crate) struct Routing {
    pub(crate) version: u64,
    pub(crate) centroids: Vec<f32>,
    /// This node published them.
    pub(crate) published: bool,
}

/// Why joining failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JoinError {
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error(
        "cluster {name:?} fronts something else: its routing state was published with \
         {theirs}; this node has {ours}. Every node of a cluster fronts the same table with \
         the same cache settings (a new cluster.name starts another cluster)"
    )]
    Mismatch {
        name: String,
        theirs: String,
        ours: String,
    },
    #[error("the published centroids are not {dim}-d f32s")]
    BadCentroids { dim: usize },
    #[error(
        "node id {id:016x} is in use by a live node at {other} (its lease is being renewed): \
         two akerds share one instance name (a copied data_dir/instance, or the same \
         backend.pgvector.instance); give each node its own"
    )]
    Duplicate { id: u64, other: String },
}

pub(crate) fn f32s_to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn bytes_to_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub(crate) fn overrides_to_bytes(o: &[(u32, u64)]) -> Vec<u8> {
    o.iter()
        .flat_map(|(c, n)| c.to_le_bytes().into_iter().chain(n.to_le_bytes()))
        .collect()
}

pub(crate) fn bytes_to_overrides(b: &[u8]) -> Vec<(u32, u64)> {
    b.chunks_exact(12)
        .map(|c| {
            let centroid = u32::from_le_bytes(c[..4].try_into().expect("4 bytes"));
            let node = u64::from_le_bytes(c[4..].try_into().expect("8 bytes"));
            (centroid, node)
        })
        .collect()
}

/// A transaction (READ COMMITTED whatever the role's default: after the lock, a
/// statement must see what the node before it committed) holding the schema's advisory
/// lock, with the tables made if they are missing. The DDL runs only when a table is
/// missing: `CREATE ... IF NOT EXISTS` checks the CREATE privilege first, which a
/// role may have had only for the first start.
async fn locked<'c>(
    client: &'c mut Client,
    t: &Tables,
) -> Result<tokio_postgres::Transaction<'c>, tokio_postgres::Error> {
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::ReadCommitted)
        .start()
        .await?;
    let key = format!("aker.cluster.{}", t.schema);
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        &[&key],
    )
    .await?;
    let have = tx
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL \
             AND to_regclass($3) IS NOT NULL",
            &[&t.routing(), &t.nodes(), &t.balance()],
        )
        .await?;
    if !have.get::<_, bool>(0) {
        tx.batch_execute(&t.ddl()).await?;
    }
    Ok(tx)
}

/// Creates the tables if needed, publishes version 1 of the centroids if the cluster
/// has none (else checks the fingerprint and loads the newest), and registers this node
/// with a fresh lease, all in one transaction under an advisory lock on the schema:
/// nodes starting at the same moment queue there, and the first one's centroids win.
pub(crate) async fn join(
    client: &mut Client,
    t: &Tables,
    j: &Joining<'_>,
) -> Result<Routing, JoinError> {
    let tx = locked(client, t).await?;
    let row = tx
        .query_opt(
            &format!(
                "SELECT version, fingerprint, centroids FROM {} WHERE cluster = $1 \
                 ORDER BY version DESC LIMIT 1",
                t.routing()
            ),
            &[&j.name],
        )
        .await?;
    let routing = match row {
        Some(r) => {
            let theirs: String = r.get(1);
            if theirs != j.fingerprint {
                return Err(mismatch(j, &theirs));
            }
            let centroids = bytes_to_f32s(r.get::<_, &[u8]>(2));
            if centroids.is_empty() || !centroids.len().is_multiple_of(j.dim) {
                return Err(JoinError::BadCentroids { dim: j.dim });
            }
            let version: i64 = r.get(0);
            Routing {
                version: version as u64,
                centroids,
                published: false,
            }
        }
        None => {
            insert_version(&tx, t, j, 1).await?;
            Routing {
                version: 1,
                centroids: j.centroids.to_vec(),
                published: true,
            }
        }
    };
    register(&tx, t, j).await?;
    tx.commit().await?;
    Ok(routing)
}

/// `j`'s centroids as the cluster's `version`.
async fn insert_version(
    tx: &tokio_postgres::Transaction<'_>,
    t: &Tables,
    j: &Joining<'_>,
    version: i64,
) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        &format!(
            "INSERT INTO {} (cluster, version, fingerprint, metric, dim, centroids, \
             published_by) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            t.routing()
        ),
        &[
            &j.name,
            &version,
            &j.fingerprint,
            &j.metric.name(),
            &(j.dim as i32),
            &f32s_to_bytes(j.centroids),
            &(j.node_id as i64),
        ],
    )
    .await?;
    Ok(())
}

/// This node's row with a fresh lease (a restart keeps its id, so its row).
async fn register(
    tx: &tokio_postgres::Transaction<'_>,
    t: &Tables,
    j: &Joining<'_>,
) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        &format!(
            "INSERT INTO {} (cluster, node_id, advertise, slot, lease_until) \
             VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5)) \
             ON CONFLICT (cluster, node_id) DO UPDATE SET advertise = EXCLUDED.advertise, \
             slot = EXCLUDED.slot, lease_until = EXCLUDED.lease_until, started_at = now(), \
             load = '\\x'",
            t.nodes()
        ),
        &[
            &j.name,
            &(j.node_id as i64),
            &j.advertise,
            &j.slot,
            &(j.lease_ms as f64 / 1000.0),
        ],
    )
    .await?;
    Ok(())
}

/// Publishes a retrained set of centroids as the next version (the operator's
/// `akerd --cluster-retrain`): nodes and clients switch at their next read; a node keeps
/// its shards' own routing until it restarts.
pub(crate) async fn publish_retrain(
    client: &mut Client,
    t: &Tables,
    j: &Joining<'_>,
) -> Result<u64, JoinError> {
    let tx = locked(client, t).await?;
    let latest = tx
        .query_opt(
            &format!(
                "SELECT fingerprint FROM {} WHERE cluster = $1 ORDER BY version DESC LIMIT 1",
                t.routing()
            ),
            &[&j.name],
        )
        .await?;
    if let Some(theirs) = latest.map(|r| r.get::<_, String>(0)) {
        if theirs != j.fingerprint {
            return Err(mismatch(j, &theirs));
        }
    }
    let r = tx
        .query_one(
            &format!(
                "SELECT coalesce(max(version), 0) FROM {} WHERE cluster = $1",
                t.routing()
            ),
            &[&j.name],
        )
        .await?;
    let version = r.get::<_, i64>(0) + 1;
    insert_version(&tx, t, j, version).await?;
    tx.execute(
        &format!("DELETE FROM {} WHERE cluster = $1", t.balance()),
        &[&j.name],
    )
    .await?;
    tx.commit().await?;
    Ok(version as u64)
}

/// A digest of everything a client routes by (centroids version, overrides epoch, live
/// nodes): the `routing_version` SEARCH replies carry (version 6). Compared for
/// equality; never 0 (0 means "not in a cluster").
pub(crate) fn routing_stamp(view: &ClusterReply) -> u64 {
    use super::mix64;
    let mut h = mix64(view.centroids_version ^ 0x61_6b_65_72);
    h = mix64(h ^ view.balance_epoch);
    for &(c, n) in &view.overrides {
        h = mix64(h ^ mix64(c as u64) ^ n);
    }
    let mut live: Vec<u64> = view
        .nodes
        .iter()
        .filter(|n| n.live)
        .map(|n| n.node_id)
        .collect();
    live.sort_unstable();
    for n in live {
        h = mix64(h ^ n);
    }
    h.max(1)
}

/// Refuses to join as `j.node_id` while another process renews that id's lease from
/// another address (two akerds sharing an instance name would share a slot, and one's
/// advances would skip the other's changes). A node restarting at a new address right
/// after its old process died is let in once that lease stops moving.
pub(crate) async fn check_unique(
    client: &Client,
    t: &Tables,
    j: &Joining<'_>,
    renew: std::time::Duration,
) -> Result<(), JoinError> {
    let sql = format!(
        "SELECT advertise, lease_until::text, lease_until > now() FROM {} \
         WHERE cluster = $1 AND node_id = $2",
        t.nodes()
    );
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&j.name, &(j.node_id as i64)];
    let read = |rows: Vec<tokio_postgres::Row>| {
        rows.first().map(|r| {
            (
                r.get::<_, String>(0),
                r.get::<_, String>(1),
                r.get::<_, bool>(2),
            )
        })
    };
    let exists = client
        .query("SELECT to_regclass($1) IS NOT NULL", &[&t.nodes()])
        .await?;
    if !exists.first().is_some_and(|r| r.get::<_, bool>(0)) {
        return Ok(());
    }
    let Some((other, until, true)) = read(client.query(&sql, &params).await?) else {
        return Ok(());
    };
    if other == j.advertise {
        return Ok(());
    }
    tokio::time::sleep(renew * 2 + std::time::Duration::from_millis(100)).await;
    match read(client.query(&sql, &params).await?) {
        Some((other, again, true)) if again != until => Err(JoinError::Duplicate {
            id: j.node_id,
            other,
        }),
        _ => Ok(()),
    }
}
