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
    pub(crate) connect: PgConnect,
    /// Bounds each connection attempt, TLS and start-up included.
    pub(crate) connect_timeout: Duration,
    pub(crate) stop: Arc<AtomicBool>,
}

/// Per-centroid searches per second, smoothed over about one balance period; started
/// afresh when the centroids change (a retrain: other centroids, other loads).
struct LoadMeter {
    last: Vec<u64>,
    at: Instant,
    rate: Vec<f64>,
    centroids_version: u64,
}

impl LoadMeter {
    fn sample(&mut self, now_totals: Vec<u64>, version: u64, window: Duration) -> &[f64] {
        if version != self.centroids_version || self.rate.len() != now_totals.len() {
            self.centroids_version = version;
            self.rate = vec![0.0; now_totals.len()];
            self.last = now_totals;
            self.at = Instant::now();
            return &self.rate;
        }
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

/// A connection within `limit` (connect, TLS and start-up together: a server that
/// accepts TCP and then stalls must not hold the lease thread, or akerd's shutdown).
async fn open_bounded(m: &Member) -> Result<Client, String> {
    match tokio::time::timeout(m.connect_timeout, pgvector::open(&m.connect)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no connection within {:?}", m.connect_timeout)),
    }
}

async fn run(m: Member) {
    let mut meter = LoadMeter {
        last: Vec::new(),
        at: Instant::now(),
        rate: Vec::new(),
        centroids_version: 0,
    };
    let mut lease = Lease {
        m: &m,
        last_balance: Instant::now(),
        last_sweep: Instant::now(),
        live_since: None,
        slot_positions: Default::default(),
        centroids: m.state.view().centroids.clone(),
    };
    let mut backoff = Duration::from_millis(50);
    while !m.stop.load(Ordering::Acquire) {
        let client = match open_bounded(&m).await {
            Ok(c) => c,
            Err(e) => {
                lease.live_since = None;
                m.state.renew_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "cluster: cannot reach PostgreSQL to renew the lease");
                sleep_unless_stopped(&m.stop, backoff).await;
                backoff = (backoff * 2).min(RECONNECT_MAX);
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        lease.serve(&client, &mut meter).await;
        // The connection failed or a renewal did: a pause before the next one.
        sleep_unless_stopped(&m.stop, Duration::from_millis(m.renew_ms)).await;
    }
    leave(&m).await;
}

/// Gives the lease up (a stop): the others take this node's centroids at their next
/// renewal instead of after the lease. Bounded: a stop never waits on the database.
pub(crate) async fn leave(m: &Member) {
    if let Ok(client) = open_bounded(m).await {
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

/// A renewal's statements, prepared on the connection.
struct Statements {
    renew: tokio_postgres::Statement,
    nodes: tokio_postgres::Statement,
    version: tokio_postgres::Statement,
    balance: tokio_postgres::Statement,
}

struct Lease<'a> {
    m: &'a Member,
    last_balance: Instant,
    last_sweep: Instant,
    /// Renewing without a failure since then: a node back from an outage (its own or
    /// the database's) sweeps nobody until it has been live for `slot_drop_after_s`.
    live_since: Option<Instant>,
    /// Long-gone nodes' slot positions at the last sweep.
    slot_positions: std::collections::HashMap<String, Option<String>>,
    centroids: Vec<f32>,
}

/// A slot name akerd makes (`aker_` and an instance name): the only kind swept, and
/// safe to quote into DROP PUBLICATION.
fn is_slot_name(s: &str) -> bool {
    s.len() <= 63
        && s.starts_with("aker_")
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// One renewal's reads.
struct Read {
    renewed: bool,
    nodes: Vec<(ClusterNode, Vec<f32>)>,
    centroids_version: u64,
    balance: Option<(u64, Vec<(u32, u64)>)>,
}

impl Lease<'_> {
    /// Renews every `renew_ms` until the connection fails or akerd stops.
    async fn serve(&mut self, c: &Client, meter: &mut LoadMeter) {
        let m = self.m;
        let period = Duration::from_millis(m.renew_ms);
        let bound = Duration::from_millis(m.lease_ms / 2);
        let st = match tokio::time::timeout(bound, self.prepare(c)).await {
            Ok(Ok(st)) => st,
            Ok(Err(e)) => {
                m.state.renew_failures.fetch_add(1, Ordering::Relaxed);
                return tracing::warn!(error = %e, "cluster: cannot prepare the lease's statements");
            }
            Err(_) => {
                m.state.renew_failures.fetch_add(1, Ordering::Relaxed);
                return tracing::warn!("cluster: preparing the lease's statements timed out");
            }
        };
        while !m.stop.load(Ordering::Acquire) {
            let started = Instant::now();
            let window = Duration::from_millis(m.balance_ms);
            let totals = m.state.centroid_loads();
            let loads = meter
                .sample(totals, m.state.centroids_version(), window)
                .to_vec();
            match tokio::time::timeout(bound, self.tick(c, &st, &loads)).await {
                Ok(Ok(())) => {
                    m.state.renewals.fetch_add(1, Ordering::Relaxed);
                    self.live_since.get_or_insert_with(Instant::now);
                }
                Ok(Err(e)) => {
                    self.live_since = None;
                    m.state.renew_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "cluster: lease renewal failed");
                    return;
                }
                Err(_) => {
                    self.live_since = None;
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

    async fn tick(
        &mut self,
        c: &Client,
        st: &Statements,
        loads: &[f64],
    ) -> Result<(), tokio_postgres::Error> {
        let read = self.read(c, st, loads).await?;
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

    /// The four statements of a renewal, prepared once per connection.
    async fn prepare(&self, c: &Client) -> Result<Statements, tokio_postgres::Error> {
        let t = &self.m.tables;
        let renew = format!(
            "UPDATE {} SET lease_until = now() + make_interval(secs => $3), \
             renewals = renewals + 1, load = $4 WHERE cluster = $1 AND node_id = $2 RETURNING 1",
            t.nodes()
        );
        // Live nodes first, then the most recently gone: a CLUSTER reply carries at most
        // CLUSTER_NODES_MAX.
        let nodes = format!(
            "SELECT node_id, advertise, lease_until > now(), load FROM {} WHERE cluster = $1 \
             ORDER BY lease_until > now() DESC, lease_until DESC LIMIT {}",
            t.nodes(),
            crate::protocol::CLUSTER_NODES_MAX
        );
        let version = format!(
            "SELECT coalesce(max(version), 0) FROM {} WHERE cluster = $1",
            t.routing()
        );
        let balance = format!(
            "SELECT epoch, overrides FROM {} WHERE cluster = $1",
            t.balance()
        );
        let (renew, nodes, version, balance) = tokio::try_join!(
            c.prepare(&renew),
            c.prepare(&nodes),
            c.prepare(&version),
            c.prepare(&balance),
        )?;
        Ok(Statements {
            renew,
            nodes,
            version,
            balance,
        })
    }

    /// Renew, members, centroids' version, overrides: prepared, pipelined, one round trip.
    async fn read(
        &self,
        c: &Client,
        st: &Statements,
        loads: &[f64],
    ) -> Result<Read, tokio_postgres::Error> {
        let m = self.m;
        let (name, id) = (&m.state.name, m.state.self_id as i64);
        let load: Vec<f32> = loads.iter().map(|&x| x as f32).collect();
        let load = schema::f32s_to_bytes(&load);
        let lease_s = m.lease_ms as f64 / 1000.0;
        let renew_params: [&(dyn ToSql + Sync); 4] = [name, &id, &lease_s, &load];
        let by_name: [&(dyn ToSql + Sync); 1] = [name];
        let (renew, nodes, version, balance) = tokio::try_join!(
            c.query(&st.renew, &renew_params),
            c.query(&st.nodes, &by_name),
            c.query_one(&st.version, &by_name),
            c.query_opt(&st.balance, &by_name),
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
                    (node, schema::bytes_to_f32s(r.get(3)))
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
        let c = schema::bytes_to_f32s(r.get(0));
        let dim = self.m.state.view().dim.max(1) as usize;
        if c.is_empty() || !c.len().is_multiple_of(dim) || c.iter().any(|x| !x.is_finite()) {
            tracing::error!(
                version = v,
                "cluster: published centroids are not {dim}-d finite f32s; kept the old ones"
            );
            return Ok(self.centroids.clone());
        }
        tracing::info!(version = v, "cluster: new centroids published (a retrain)");
        Ok(c)
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
            nodes: read.nodes.iter().map(|(n, _)| n.clone()).collect(),
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
        for (node, l) in &read.nodes {
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
        let after = Duration::from_secs(m.slot_drop_after_s);
        let settled = self.live_since.is_some_and(|t| t.elapsed() >= after);
        if m.slot_drop_after_s == 0 || !settled || self.last_sweep.elapsed() < SLOT_SWEEP.min(after)
        {
            return Ok(());
        }
        self.last_sweep = Instant::now();
        let gone = c
            .query(
                &format!(
                    "SELECT n.node_id, n.slot, s.active, s.confirmed_flush_lsn::text \
                     FROM {} n LEFT JOIN pg_replication_slots s ON s.slot_name = n.slot \
                     WHERE n.cluster = $1 AND n.lease_until < now() - make_interval(secs => $2)",
                    m.tables.nodes()
                ),
                &[&m.state.name, &(m.slot_drop_after_s as f64)],
            )
            .await?;
        let mut seen = std::collections::HashMap::new();
        for r in gone {
            let (id, slot): (i64, String) = (r.get(0), r.get(1));
            let (active, at): (Option<bool>, Option<String>) = (r.get(2), r.get(3));
            if !is_slot_name(&slot) || active == Some(true) {
                continue;
            }
            // A follower still reading advances its slot: dropped only when its position
            // stood still since the last sweep (or the slot is gone already).
            seen.insert(slot.clone(), at.clone());
            if at.is_some() && self.slot_positions.get(&slot) != Some(&at) {
                continue;
            }
            self.drop_node(c, id, &slot).await?;
        }
        self.slot_positions = seen;
        Ok(())
    }

    async fn drop_node(
        &self,
        c: &Client,
        id: i64,
        slot: &str,
    ) -> Result<(), tokio_postgres::Error> {
        let m = self.m;
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
        Ok(())
    }
}
