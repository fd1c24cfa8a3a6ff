//! The lease thread ("aker-cluster"): every `renew_ms`, one round trip renews this
//! node's lease, publishes its load and reads the membership, the centroids' version
//! and the overrides; the view executors and CLUSTER read is then replaced whole. The
//! live node with the lowest id also balances (overrides by load) and drops the slots
//! of nodes gone longer than `slot_drop_after_s`. A stop leaves the cluster at once
//! (its lease set to now), so the others take its centroids without waiting it out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shards::router::Router;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use super::schema::{self, Tables};
use super::{balance, ClusterState};
use crate::config::Balance;
use crate::protocol::{ClusterNode, ClusterReply};
use crate::service::pgvector::{self, PgConnect};

/// How often the balancing node looks for slots of nodes long gone.
const SLOT_SWEEP: Duration = Duration::from_secs(30);
/// Pause between connection attempts, at most.
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// Everything the lease thread needs.
pub(crate) struct Member {
    pub(crate) state: Arc<ClusterState>,
    pub(crate) tables: Tables,
    pub(crate) advertise: String,
    pub(crate) slot: String,
    pub(crate) lease_ms: u64,
    pub(crate) renew_ms: u64,
    pub(crate) balance: Balance,
    pub(crate) balance_ms: u64,
    pub(crate) slot_drop_after_s: u64,
    pub(crate) router: Arc<Router>,
    pub(crate) connect: PgConnect,
    pub(crate) stop: Arc<AtomicBool>,
}

/// Per-centroid searches per second, smoothed over about one balance period.
struct LoadMeter {
    last: Vec<u64>,
    at: Instant,
    rate: Vec<f64>,
}

impl LoadMeter {
    fn sample(&mut self, now_totals: Vec<u64>, window: Duration) -> &[f64] {
        let dt = self.at.elapsed().as_secs_f64().max(1e-3);
        let alpha = (dt / window.as_secs_f64().max(dt)).min(1.0);
        if now_totals.len() == self.rate.len() && self.last.len() == self.rate.len() {
            for (c, &t) in now_totals.iter().enumerate() {
                let r = t.saturating_sub(self.last[c]) as f64 / dt;
                self.rate[c] += alpha * (r - self.rate[c]);
            }
        }
        self.last = now_totals;
        self.at = Instant::now();
        &self.rate
    }
}

pub(crate) fn spawn(m: Member) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("aker-cluster".into())
        .spawn(move || {
            let rt = match pgvector::runtime() {
                Ok(rt) => rt,
                Err(e) => return tracing::error!(error = %e, "cluster: no runtime"),
            };
            rt.block_on(run(m));
        })
}

async fn run(m: Member) {
    let n = m.router.centroids();
    let mut meter = LoadMeter {
        last: m.router.centroid_loads(),
        at: Instant::now(),
        rate: vec![0.0; n],
    };
    let mut lease = Lease {
        m: &m,
        last_balance: Instant::now(),
        last_sweep: Instant::now(),
        centroids: m.state.view().centroids.clone(),
    };
    let mut backoff = Duration::from_millis(50);
    while !m.stop.load(Ordering::Acquire) {
        let client = match pgvector::open(&m.connect).await {
            Ok(c) => c,
            Err(e) => {
                m.state.renew_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "cluster: cannot reach PostgreSQL to renew the lease");
                sleep_unless_stopped(&m.stop, backoff).await;
                backoff = (backoff * 2).min(RECONNECT_MAX);
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        lease.serve(&client, &mut meter).await;
    }
    if let Ok(client) = pgvector::open(&m.connect).await {
        let sql = format!(
            "UPDATE {} SET lease_until = now() WHERE cluster = $1 AND node_id = $2",
            m.tables.nodes()
        );
        let id = m.state.self_id as i64;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&m.state.name, &id];
        let leave = client.execute(&sql, &params);
        let _ = tokio::time::timeout(Duration::from_secs(2), leave).await;
    }
}

async fn sleep_unless_stopped(stop: &AtomicBool, d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end && !stop.load(Ordering::Acquire) {
        tokio::time::sleep(Duration::from_millis(50).min(d)).await;
    }
}

struct Lease<'a> {
    m: &'a Member,
    last_balance: Instant,
    last_sweep: Instant,
    centroids: Vec<f32>,
}

/// One renewal's reads.
struct Read {
    renewed: bool,
    nodes: Vec<(ClusterNode, Vec<f32>, f64)>,
    centroids_version: u64,
    balance: Option<(u64, Vec<(u32, u64)>)>,
}

impl Lease<'_> {
    /// Renews every `renew_ms` until the connection fails or akerd stops.
    async fn serve(&mut self, c: &Client, meter: &mut LoadMeter) {
        let m = self.m;
        let period = Duration::from_millis(m.renew_ms);
        let bound = Duration::from_millis(m.lease_ms / 2);
        while !m.stop.load(Ordering::Acquire) {
            let started = Instant::now();
            let totals = if m.state.local_matches() {
                m.router.centroid_loads()
            } else {
                Vec::new()
            };
            let window = Duration::from_millis(m.balance_ms);
            let loads = meter.sample(totals, window).to_vec();
            match tokio::time::timeout(bound, self.tick(c, &loads)).await {
                Ok(Ok(())) => {
                    m.state.renewals.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Err(e)) => {
                    m.state.renew_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "cluster: lease renewal failed");
                    return;
                }
                Err(_) => {
                    m.state.renew_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        ms = bound.as_millis() as u64,
                        "cluster: lease renewal timed out"
                    );
                    return;
                }
            }
            sleep_unless_stopped(&m.stop, period.saturating_sub(started.elapsed())).await;
        }
    }

    async fn tick(&mut self, c: &Client, loads: &[f64]) -> Result<(), tokio_postgres::Error> {
        let read = self.read(c, loads).await?;
        let m = self.m;
        if !read.renewed {
            // Our row is gone (dropped as long gone while we could not renew): again.
            tracing::warn!("cluster: this node's row was gone; registering again");
            self.register(c).await?;
        }
        if read.centroids_version > m.state.view().centroids_version {
            self.centroids = self.fetch_centroids(c, read.centroids_version).await?;
        }
        let view = self.view(&read);
        let owned_load: f64 = (0..loads.len())
            .filter(|&j| m.state.owns(j))
            .map(|j| loads[j])
            .sum();
        m.state
            .owned_load_per_s
            .store(owned_load as u64, Ordering::Relaxed);
        let live: Vec<u64> = view
            .nodes
            .iter()
            .filter(|n| n.live)
            .map(|n| n.node_id)
            .collect();
        m.state.publish(view.clone());
        if live.first() == Some(&m.state.self_id) {
            self.balance(c, &read, &live).await?;
            self.sweep(c).await?;
        }
        Ok(())
    }

    /// Renew, members, centroids' version, overrides: pipelined, one round trip.
    async fn read(&self, c: &Client, loads: &[f64]) -> Result<Read, tokio_postgres::Error> {
        let m = self.m;
        let (name, id) = (&m.state.name, m.state.self_id as i64);
        let load: Vec<f32> = loads.iter().map(|&x| x as f32).collect();
        let load = schema::f32s_to_bytes(&load);
        let lease_s = m.lease_ms as f64 / 1000.0;
        let renew_sql = format!(
            "UPDATE {} SET lease_until = now() + make_interval(secs => $3), \
             renewals = renewals + 1, load = $4 WHERE cluster = $1 AND node_id = $2 RETURNING 1",
            m.tables.nodes()
        );
        let nodes_sql = format!(
            "SELECT node_id, advertise, lease_until > now(), load, \
             extract(epoch from now() - lease_until)::float8 FROM {} WHERE cluster = $1 \
             ORDER BY node_id",
            m.tables.nodes()
        );
        let version_sql = format!(
            "SELECT coalesce(max(version), 0) FROM {} WHERE cluster = $1",
            m.tables.routing()
        );
        let balance_sql = format!(
            "SELECT epoch, overrides FROM {} WHERE cluster = $1",
            m.tables.balance()
        );
        let renew_params: [&(dyn ToSql + Sync); 4] = [name, &id, &lease_s, &load];
        let by_name: [&(dyn ToSql + Sync); 1] = [name];
        let (renew, nodes, version, balance) = tokio::try_join!(
            c.query(&renew_sql, &renew_params),
            c.query(&nodes_sql, &by_name),
            c.query_one(&version_sql, &by_name),
            c.query_opt(&balance_sql, &by_name),
        )?;
        Ok(Read {
            renewed: !renew.is_empty(),
            nodes: nodes
                .iter()
                .map(|r| {
                    let node = ClusterNode {
                        node_id: r.get::<_, i64>(0) as u64,
                        advertise: r.get(1),
                        live: r.get(2),
                    };
                    (node, schema::bytes_to_f32s(r.get(3)), r.get(4))
                })
                .collect(),
            centroids_version: version.get::<_, i64>(0) as u64,
            balance: balance.map(|b| {
                (
                    b.get::<_, i64>(0) as u64,
                    schema::bytes_to_overrides(b.get(1)),
                )
            }),
        })
    }

    async fn register(&self, c: &Client) -> Result<(), tokio_postgres::Error> {
        let m = self.m;
        c.execute(
            &format!(
                "INSERT INTO {} (cluster, node_id, advertise, slot, lease_until) \
                 VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5)) \
                 ON CONFLICT (cluster, node_id) DO NOTHING",
                m.tables.nodes()
            ),
            &[
                &m.state.name,
                &(m.state.self_id as i64),
                &m.advertise,
                &m.slot,
                &(m.lease_ms as f64 / 1000.0),
            ],
        )
        .await?;
        Ok(())
    }

    async fn fetch_centroids(&self, c: &Client, v: u64) -> Result<Vec<f32>, tokio_postgres::Error> {
        let r = c
            .query_one(
                &format!(
                    "SELECT centroids FROM {} WHERE cluster = $1 AND version = $2",
                    self.m.tables.routing()
                ),
                &[&self.m.state.name, &(v as i64)],
            )
            .await?;
        tracing::info!(version = v, "cluster: new centroids published (a retrain)");
        Ok(schema::bytes_to_f32s(r.get(0)))
    }

    fn view(&self, read: &Read) -> ClusterReply {
        let old = self.m.state.view();
        let (balance_epoch, overrides) = read.balance.clone().unwrap_or_default();
        let mut v = ClusterReply {
            name: old.name.clone(),
            routing_version: 0,
            centroids_version: read.centroids_version.max(old.centroids_version),
            balance_epoch,
            self_id: old.self_id,
            lease_ms: self.m.lease_ms as u32,
            metric: old.metric,
            dim: old.dim,
            centroids: self.centroids.clone(),
            nodes: read.nodes.iter().map(|(n, _, _)| n.clone()).collect(),
            overrides: if self.m.balance == Balance::Load {
                overrides
            } else {
                Vec::new()
            },
        };
        v.routing_version = schema::routing_stamp(&v);
        v
    }

    /// The balancing node: sums the live nodes' loads and publishes new overrides when
    /// they lower the busiest node's load enough (`balance.rs`).
    async fn balance(
        &mut self,
        c: &Client,
        read: &Read,
        live: &[u64],
    ) -> Result<(), tokio_postgres::Error> {
        let m = self.m;
        if m.balance != Balance::Load
            || self.last_balance.elapsed() < Duration::from_millis(m.balance_ms)
        {
            return Ok(());
        }
        self.last_balance = Instant::now();
        let n = self.centroids.len() / m.state.view().dim.max(1) as usize;
        let mut loads = vec![0.0f64; n];
        for (node, l, _) in &read.nodes {
            if node.live && l.len() == n {
                for (c, x) in l.iter().enumerate() {
                    loads[c] += *x as f64;
                }
            }
        }
        let current = read
            .balance
            .as_ref()
            .map(|b| b.1.clone())
            .unwrap_or_default();
        let Some(over) = balance::rebalance(&loads, live, &current) else {
            return Ok(());
        };
        c.execute(
            &format!(
                "INSERT INTO {0} (cluster, epoch, overrides, published_by) VALUES ($1, 1, $2, $3) \
                 ON CONFLICT (cluster) DO UPDATE SET epoch = {0}.epoch + 1, \
                 overrides = EXCLUDED.overrides, published_by = EXCLUDED.published_by, \
                 published_at = now()",
                m.tables.balance()
            ),
            &[
                &m.state.name,
                &schema::overrides_to_bytes(&over),
                &(m.state.self_id as i64),
            ],
        )
        .await?;
        m.state.balance_publications.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            overrides = over.len(),
            "cluster: published a load-aware assignment"
        );
        Ok(())
    }

    /// Drops the slot, the publication and the row of every node gone longer than
    /// `slot_drop_after_s` (an active slot is left: that node is back).
    async fn sweep(&mut self, c: &Client) -> Result<(), tokio_postgres::Error> {
        let m = self.m;
        if m.slot_drop_after_s == 0
            || self.last_sweep.elapsed() < SLOT_SWEEP.min(Duration::from_secs(m.slot_drop_after_s))
        {
            return Ok(());
        }
        self.last_sweep = Instant::now();
        let gone = c
            .query(
                &format!(
                    "SELECT node_id, slot FROM {} WHERE cluster = $1 AND \
                     lease_until < now() - make_interval(secs => $2)",
                    m.tables.nodes()
                ),
                &[&m.state.name, &(m.slot_drop_after_s as f64)],
            )
            .await?;
        for r in gone {
            let (id, slot): (i64, String) = (r.get(0), r.get(1));
            c.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND NOT active",
                &[&slot],
            )
            .await?;
            c.batch_execute(&format!("DROP PUBLICATION IF EXISTS \"{slot}\""))
                .await?;
            c.execute(
                &format!(
                    "DELETE FROM {} WHERE cluster = $1 AND node_id = $2",
                    m.tables.nodes()
                ),
                &[&m.state.name, &id],
            )
            .await?;
            m.state.slots_dropped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(node = %format!("{:016x}", id as u64), slot = %slot,
                "cluster: dropped the replication slot of a node gone longer than slot_drop_after_s");
        }
        Ok(())
    }
}
