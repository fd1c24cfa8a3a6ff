//! Joining the cluster at start (a step of `service::start`): the node id, the tables,
//! the centroids (this node's published, or the cluster's loaded into the local router),
//! then the lease thread.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use shards::router::Router;
use shards::snapshot::RouterImage;

use super::member::{self, Member};
use super::schema::{self, Joining, Tables};
use super::ClusterState;
use crate::config::{cluster_fingerprint, Config, ConfigError};
use crate::protocol::{ClusterNode, ClusterReply};
use crate::service::pgvector::{self, changes, PgTarget};
use crate::service::StartError;

/// A node's id from its instance name: the name itself when it is 16 hex digits (what
/// akerd writes to `data_dir/instance`), else a hash of it.
pub(crate) fn node_id(instance: &str) -> u64 {
    match u64::from_str_radix(instance, 16) {
        Ok(id) if instance.len() == 16 => id,
        _ => xxhash_rust::xxh3::xxh3_64(instance.as_bytes()),
    }
}

/// What joining gives the rest of the start.
pub(crate) struct Joined {
    pub(crate) state: Arc<ClusterState>,
    slot: String,
}

fn config_error(key: &str, why: &str) -> StartError {
    StartError::Config(ConfigError::invalid(key, why))
}

/// Joins `cfg.cluster`: publishes or loads the centroids; the local router is rebuilt on
/// the cluster's centroids unless a restored snapshot's entries were routed by others.
pub(crate) fn join(
    cfg: &Config,
    target: &Arc<PgTarget>,
    router: &mut Router,
    restored_entries: bool,
) -> Result<Joined, StartError> {
    let c = &cfg.cluster;
    let (Some(name), Some(advertise)) = (&c.name, &c.advertise) else {
        return Err(config_error("cluster", "name and advertise are required"));
    };
    let section = cfg
        .backend
        .pgvector
        .as_ref()
        .ok_or_else(|| config_error("cluster", "needs [backend.pgvector]"))?;
    if section.instance.is_none() && cfg.backend.data_dir.is_none() {
        return Err(config_error(
            "cluster",
            "needs backend.data_dir (where the node id is kept) or backend.pgvector.instance: \
             a node's id must outlive its address",
        ));
    }
    let instance = changes::instance_name(
        section,
        cfg.backend.data_dir.as_deref(),
        cfg.server.listen.port(),
    )?;
    let self_id = node_id(&instance);
    let slot = changes::slot_name(&instance);
    let fingerprint = cluster_fingerprint(cfg, &target.table, target.dim, target.metric.name());
    check_state_fits(cfg, router.centroids(), target.dim)?;
    let tables = Tables {
        schema: c.schema.clone(),
    };
    let joining = Joining {
        name,
        node_id: self_id,
        advertise,
        slot: &slot,
        lease_ms: c.lease_ms,
        fingerprint: &fingerprint,
        metric: target.metric,
        dim: target.dim,
        centroids: router.centroid_vectors(),
    };
    let renew = Duration::from_millis(c.renew_ms);
    let routing = block_on_db(target, |mut client| async move {
        schema::check_unique(&client, &tables, &joining, renew).await?;
        schema::join(&mut client, &tables, &joining).await
    })?;
    let matches = routing.centroids == router.centroid_vectors();
    let local_matches = if matches {
        true
    } else if restored_entries {
        tracing::warn!(
            "cluster: the restored snapshot was routed by other centroids; \
            this node keeps them until its next cold start (searches find the cluster's \
            centroid on their own)"
        );
        false
    } else {
        *router = router_on(&routing.centroids, router, target)?;
        true
    };
    tracing::info!(cluster = %name, node = %format!("{self_id:016x}"), version = routing.version,
        published = routing.published, "cluster: joined");
    let view = ClusterReply {
        name: name.clone(),
        routing_version: 0,
        centroids_version: routing.version,
        balance_epoch: 0,
        self_id,
        lease_ms: c.lease_ms as u32,
        metric: target.metric,
        dim: target.dim as u32,
        centroids: routing.centroids,
        nodes: vec![ClusterNode {
            node_id: self_id,
            live: true,
            advertise: advertise.clone(),
        }],
        overrides: Vec::new(),
    };
    let mut view = view;
    view.routing_version = schema::routing_stamp(&view);
    let state = Arc::new(ClusterState::new(view, local_matches));
    Ok(Joined { state, slot })
}

/// The lease thread's bound on one connection attempt: the pgvector section's
/// `connect_timeout_ms`, within half a lease.
fn connect_timeout(cfg: &Config) -> Duration {
    let ms = cfg
        .backend
        .pgvector
        .as_ref()
        .map_or(1_000, |s| s.connect_timeout_ms)
        .clamp(100, cfg.cluster.lease_ms / 2);
    Duration::from_millis(ms)
}

/// Starts the lease thread; it stops with `stop`, giving the lease up.
pub(crate) fn start_lease(
    joined: &Joined,
    cfg: &Config,
    target: &PgTarget,
    stop: &Arc<AtomicBool>,
) -> Result<JoinHandle<()>, StartError> {
    let c = &cfg.cluster;
    let m = Member {
        state: joined.state.clone(),
        tables: Tables {
            schema: c.schema.clone(),
        },
        advertise: c.advertise.clone().unwrap_or_default(),
        slot: joined.slot.clone(),
        lease_ms: c.lease_ms,
        renew_ms: c.renew_ms,
        balance: c.balance,
        balance_ms: c.balance_ms,
        slot_drop_after_s: c.slot_drop_after_s,
        connect: target.conn.clone(),
        connect_timeout: connect_timeout(cfg),
        stop: stop.clone(),
    };
    Ok(member::spawn(m)?)
}

/// The routing state must fit one CLUSTER reply (`server.frame_bytes_max`) with room
/// for the most nodes a reply carries: else no client could fetch it.
fn check_state_fits(cfg: &Config, centroids: usize, dim: usize) -> Result<(), StartError> {
    let nodes_bytes = crate::protocol::CLUSTER_NODES_MAX * (12 + 255) * 2;
    let need = 64 + centroids * dim * 4 + nodes_bytes;
    let max = cfg.server.max_frame_bytes as usize;
    if need > max {
        return Err(config_error(
            "server.frame_bytes_max",
            &format!(
                "a CLUSTER reply of {centroids} centroids of dimension {dim} needs up to \
                 {need} bytes: raise frame_bytes_max or lower sharding.centroids"
            ),
        ));
    }
    Ok(())
}

/// A router over the cluster's `centroids`, for the shards of `local`.
fn router_on(centroids: &[f32], local: &Router, target: &PgTarget) -> Result<Router, StartError> {
    let n = centroids.len() / target.dim;
    let shards = local.shards();
    let img = RouterImage {
        centroids: centroids.to_vec(),
        assignment: (0..n).map(|j| (j % shards) as u32).collect(),
        previous: vec![u32::MAX; n], // no shard left
        shares: Vec::new(),
    };
    Ok(Router::from_image(&img, target.dim, target.metric, shards)?)
}

/// Runs `f` on a fresh connection, on a runtime of its own, bounded by the start wait.
fn block_on_db<F, Fut, T>(target: &PgTarget, f: F) -> Result<T, StartError>
where
    F: FnOnce(tokio_postgres::Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, schema::JoinError>>,
{
    let rt = pgvector::runtime()?;
    rt.block_on(async {
        let client = pgvector::open(&target.conn)
            .await
            .map_err(|e| StartError::Backend(format!("cluster: {e}")))?;
        match tokio::time::timeout(Duration::from_secs(30), f(client)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StartError::Backend(format!("cluster: {e}"))),
            Err(_) => Err(StartError::Backend(
                "cluster: joining took over 30 s (a lock held on the cluster's tables?)".into(),
            )),
        }
    })
}

/// `akerd --cluster-retrain`: trains new centroids on a fresh sample of the table and
/// publishes them as the cluster's next version. Nodes and clients switch at their next
/// read (a renewal; a reply's routing version); each node's shards keep the routing they
/// were built on until it restarts, and count searches against the new centroids.
pub(crate) fn retrain(cfg: &Config) -> Result<String, StartError> {
    let c = &cfg.cluster;
    let name = c
        .name
        .as_ref()
        .ok_or_else(|| config_error("cluster.name", "--cluster-retrain needs a cluster"))?;
    let section = cfg
        .backend
        .pgvector
        .as_ref()
        .ok_or_else(|| config_error("cluster", "needs [backend.pgvector]"))?;
    let (target, sample) = pgvector::start(
        section,
        cfg.cache.metric,
        cfg.cache.k_max,
        cfg.cache.delta,
        cfg.cache.store_vectors,
        cfg.sharding.sample_rows,
    )?;
    let sample =
        sample.ok_or_else(|| StartError::Data("the table is empty: nothing to train on".into()))?;
    let rows = sample.sample(cfg.sharding.sample_rows);
    let router = Router::train(
        &rows,
        target.dim,
        target.metric,
        cfg.sharding.centroids,
        1,
        rand::random(),
    )?;
    let fingerprint = cluster_fingerprint(cfg, &target.table, target.dim, target.metric.name());
    let tables = Tables {
        schema: c.schema.clone(),
    };
    let joining = Joining {
        name,
        node_id: 0,
        advertise: "",
        slot: "",
        lease_ms: c.lease_ms,
        fingerprint: &fingerprint,
        metric: target.metric,
        dim: target.dim,
        centroids: router.centroid_vectors(),
    };
    let v = block_on_db(&target, |mut client| async move {
        schema::publish_retrain(&mut client, &tables, &joining).await
    })?;
    Ok(format!(
        "cluster {name}: centroids version {v} published ({} centroids); the load-aware \
         overrides were reset",
        router.centroids()
    ))
}
