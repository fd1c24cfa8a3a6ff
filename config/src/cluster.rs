//! `[cluster]`: a tier of akerd nodes in front of one PostgreSQL table, coordinated
//! through tables in that database (`docs/CLUSTER.md`). Absent `name`: a lone node.

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// How centroids are given to nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Rendezvous hashing, then hot centroids moved off the busiest nodes by measured
    /// load (overrides published in PostgreSQL by the live node with the lowest id).
    #[default]
    Load,
    /// Rendezvous hashing only: equal counts of centroids, whatever their load.
    Rendezvous,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// The cluster's name; every node of it fronts the same table with the same cache
    /// settings. Unset: not in a cluster.
    pub name: Option<String>,
    /// `host:port` clients reach this node at (required with `name`).
    pub advertise: Option<String>,
    /// The PostgreSQL schema holding the routing state and the membership.
    pub schema: String,
    /// A node is live while its lease, renewed every `renew_ms`, holds (judged on
    /// PostgreSQL's clock).
    pub lease_ms: u64,
    pub renew_ms: u64,
    /// A node gone this long has its replication slot dropped by a live node (else
    /// PostgreSQL keeps WAL for it forever). 0: never.
    pub slot_drop_after_s: u64,
    pub balance: Balance,
    /// How often the balancing node looks at the published loads.
    pub balance_ms: u64,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            name: None,
            advertise: None,
            schema: "aker".into(),
            lease_ms: 5_000,
            renew_ms: 1_000,
            slot_drop_after_s: 86_400,
            balance: Balance::Load,
            balance_ms: 10_000,
        }
    }
}

/// Longest cluster name (it goes into the slot's name).
pub const CLUSTER_NAME_LEN_MAX: usize = 32;

impl ClusterSection {
    pub fn enabled(&self) -> bool {
        self.name.is_some()
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, m: &str| Err(ConfigError::invalid(format!("cluster.{key}"), m));
        let Some(name) = &self.name else {
            return Ok(());
        };
        // Plain SQL identifiers: a letter first, no `pg_` (reserved for the system).
        let ident = |s: &str| {
            s.len() <= CLUSTER_NAME_LEN_MAX
                && s.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
                && !s.starts_with("pg_")
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if !ident(name) {
            return bad("name", "1 to 32 of a-z, 0-9 and _, a letter first, not pg_");
        }
        if !ident(&self.schema) {
            return bad(
                "schema",
                "1 to 32 of a-z, 0-9 and _, a letter first, not pg_",
            );
        }
        match &self.advertise {
            None => return bad("advertise", "is required with cluster.name"),
            Some(a) if !valid_advertise(a) => {
                return bad("advertise", "must be host:port (at most 255 bytes)")
            }
            Some(_) => {}
        }
        if self.renew_ms == 0 || self.lease_ms < 2 * self.renew_ms || self.lease_ms > 3_600_000 {
            return bad(
                "lease_ms",
                "must be at least twice renew_ms (renew_ms >= 1), at most an hour",
            );
        }
        if self.balance_ms < self.renew_ms {
            return bad("balance_ms", "must be at least renew_ms");
        }
        Ok(())
    }
}

fn valid_advertise(a: &str) -> bool {
    let port = a.rsplit_once(':').and_then(|(h, p)| {
        (!h.is_empty()).then_some(())?;
        p.parse::<u16>().ok()
    });
    a.len() <= 255 && port.is_some_and(|p| p != 0)
}

/// Cache keys that are a node's own resources, left out of the cluster's fingerprint:
/// nodes may differ in memory, snapshots and start-up; not in what an answer means.
const PER_NODE_CACHE_KEYS: [&str; 10] = [
    // Stated on its own line (from the index, whatever the file says).
    "metric",
    "capacity_bytes",
    "capacity_objects",
    "prefault_bytes",
    "huge_pages",
    "owner_queue_depth",
    "snapshot_on_shutdown",
    "snapshot_interval_s",
    "snapshot_load",
    "recall_checks_per_s",
];

/// The text every node of a cluster must agree on: the table, its dimension and metric,
/// the centroid count and the cache settings that decide answers (TOML, keys sorted).
pub fn cluster_fingerprint(cfg: &crate::Config, table: &str, dim: usize, metric: &str) -> String {
    let mut cache = match toml::Value::try_from(&cfg.cache) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::value::Table::new(),
    };
    for k in PER_NODE_CACHE_KEYS {
        cache.remove(k);
    }
    let cache: std::collections::BTreeMap<_, _> = cache.into_iter().collect();
    let mut out = format!(
        "table = {table:?}\ndim = {dim}\nmetric = {metric:?}\ncentroids = {}\nbalance = {:?}\n",
        cfg.sharding.centroids, cfg.cluster.balance
    );
    for (k, v) in cache {
        out.push_str(&format!("cache.{k} = {v}\n"));
    }
    out
}
