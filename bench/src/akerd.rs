//! akerd's effective cache configuration for the runner (`bench recall --akerd-config`):
//! the daemon's own file read with the daemon's own functions (`aker_config`), so a
//! runner row labelled `akerd` cannot drift from what akerd would run:
//!
//! - the engine config is `cache.engine_config(dim)`,
//! - the hit policy is `cache.policy`,
//! - the shard count is `sharding.shard_count(server.executors)` and the sharding
//!   `sharding.engine(shards)`,
//! - the router trains on `Dataset::sample(sharding.sample_rows)` of the collection.
//!
//! Two departures, both forced by the runner having no daemon around the engine: akerd
//! rebalances centroids and pool shares on a timer (`sharding.rebalance_ms`), the runner
//! replays a stream without a clock, so `rebalance_every` (searches between two
//! rebalances) is `shards::sharded::ShardingConfig::default()`'s as the stand-in; and
//! the pool budget follows `--pools` like every other row unless the pool is `config`
//! (the runner sets `CacheConfig::capacity` per run).

use std::fmt;
use std::path::{Path, PathBuf};

use aker_config::Config;
use shards::sharded::ShardingConfig;
use shards::{CacheConfig, Capacity, Metric, PolicyConfig};

/// An akerd configuration file, loaded and checked against the run's metric.
#[derive(Clone, Debug)]
pub struct AkerdFile {
    pub path: PathBuf,
    pub config: Config,
    /// The metric its rows run with: the file's `cache.metric`, which must then equal
    /// `--metric`, or `--metric` when the file leaves it unset.
    pub metric: Metric,
}

/// The file's metric if it sets one (it must equal the run's), else the run's.
pub fn resolve_metric(file: Option<Metric>, run: Metric) -> Result<Metric, String> {
    match file {
        Some(m) if m != run => Err(format!(
            "cache.metric = \"{}\" in the akerd config, but the run's --metric is {}: \
             pass --metric {} or change the file",
            m.name(),
            run.name(),
            m.name()
        )),
        _ => Ok(run),
    }
}

impl AkerdFile {
    /// Reads `path` with `aker_config::Config::read` (printing its deprecation notes),
    /// validates it as akerd does at start, and resolves the metric against `metric`
    /// (`--metric`).
    pub fn load(path: &Path, metric: Metric) -> Result<AkerdFile, String> {
        let (config, deprecated) = Config::read(path).map_err(|e| e.to_string())?;
        for d in &deprecated {
            eprintln!("warning: {}: {d}", path.display());
        }
        AkerdFile::new(path.to_path_buf(), config, metric)
    }

    /// As [`AkerdFile::load`], for a configuration already parsed.
    pub fn new(path: PathBuf, config: Config, metric: Metric) -> Result<AkerdFile, String> {
        config
            .validate()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let metric = resolve_metric(config.cache.metric, metric)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(AkerdFile {
            path,
            config,
            metric,
        })
    }

    /// Reserve results per entry (Δ): the ground truth must reach `k + delta`.
    pub fn delta(&self) -> usize {
        self.config.cache.delta
    }

    /// akerd's shard count: `sharding.shard_count(server.executors)`.
    pub fn shards(&self) -> usize {
        self.config
            .sharding
            .shard_count(self.config.server.executors)
    }

    /// `sharding.engine(shards)`, with the engine's default search-count period standing
    /// in for akerd's timer (`rebalance_ms`): the runner has no clock-driven loop.
    pub fn sharding(&self) -> ShardingConfig {
        ShardingConfig {
            rebalance_every: ShardingConfig::default().rebalance_every,
            ..self.config.sharding.engine(self.shards())
        }
    }

    /// `cache.engine_config(dim)` with the metric resolved: exactly akerd's, its own
    /// capacity included (a run replaces the capacity unless the pool is `config`).
    pub fn engine_config(&self, dim: usize) -> Result<CacheConfig, String> {
        let mut section = self.config.cache.clone();
        section.metric = Some(self.metric);
        section
            .engine_config(dim)
            .map_err(|e| format!("{}: {e}", self.path.display()))
    }

    /// What a run of a `dim`-dimensional collection needs.
    pub fn setup(&self, dim: usize) -> Result<AkerdSetup, String> {
        Ok(AkerdSetup {
            cache: self.engine_config(dim)?,
            policy: self.config.cache.policy.clone(),
            sharding: self.sharding(),
            sample_rows: self.config.sharding.sample_rows,
        })
    }

    /// The settings the report states for akerd rows.
    pub fn settings(&self) -> AkerdSettings {
        let c = &self.config.cache;
        // The dimension does not change the capacity; `new` validated the file, which
        // builds the engine config for a stand-in dimension of 1 too.
        let capacity = self
            .engine_config(1)
            .expect("validated when loaded")
            .capacity;
        AkerdSettings {
            path: self.path.clone(),
            delta: c.delta,
            k_max: c.k_max,
            filter_candidates: c.filter_candidates,
            standby_search: c.standby_search,
            store_vectors: c.store_vectors,
            filter: c.filter,
            policy: c.policy.clone(),
            eviction: c.eviction,
            capacity,
            shards: self.shards(),
            executors: self.config.server.executors,
            centroids: self.config.sharding.centroids,
            sample_rows: self.config.sharding.sample_rows,
            rebalance_ms: self.config.sharding.rebalance_ms,
            rebalance_every: self.sharding().rebalance_every,
        }
    }
}

/// akerd's configuration for one collection: what `experiment::run` builds its cache
/// from for an `akerd` row.
#[derive(Clone, Debug)]
pub struct AkerdSetup {
    /// `cache.engine_config(dim)`; its capacity is the file's (`--pools config`).
    pub cache: CacheConfig,
    pub policy: PolicyConfig,
    pub sharding: ShardingConfig,
    /// Most collection rows the router's k-means trains on (`sharding.sample_rows`).
    pub sample_rows: usize,
}

/// The effective settings of akerd rows, for the report's header.
#[derive(Clone, Debug)]
pub struct AkerdSettings {
    pub path: PathBuf,
    pub delta: usize,
    pub k_max: usize,
    pub filter_candidates: usize,
    pub standby_search: shards::StandbySearch,
    pub store_vectors: bool,
    pub filter: shards::FilterKind,
    pub policy: PolicyConfig,
    pub eviction: shards::Eviction,
    /// The file's own pool budget (what `--pools config` runs).
    pub capacity: Capacity,
    pub shards: usize,
    pub executors: usize,
    pub centroids: usize,
    pub sample_rows: usize,
    pub rebalance_ms: u64,
    /// Searches between two rebalances in the runner (the stand-in for `rebalance_ms`).
    pub rebalance_every: u64,
}

/// `256 MiB` / `1.5 MiB` / `1000 B`; `5000 objects`.
pub fn capacity_label(c: Capacity) -> String {
    match c {
        Capacity::Objects(n) => format!("{n} objects"),
        Capacity::Bytes(b) if b >= 1 << 20 => {
            let mib = b as f64 / (1 << 20) as f64;
            if mib.fract() == 0.0 {
                format!("{mib} MiB")
            } else {
                format!("{mib:.1} MiB")
            }
        }
        Capacity::Bytes(b) => format!("{b} B"),
    }
}

/// A policy as the report names it.
pub fn policy_label(p: &PolicyConfig) -> String {
    match *p {
        PolicyConfig::Aker {
            alpha_l,
            alpha_t,
            tau_init_divisor,
        } => format!("aker (α_L = {alpha_l}, α_T = {alpha_t}, τ₀ = minD / {tau_init_divisor})"),
        PolicyConfig::AkerRerank {
            alpha_l,
            alpha_t,
            tau_init_divisor,
        } => format!(
            "aker_rerank (α_L = {alpha_l}, α_T = {alpha_t}, τ₀ = minD / {tau_init_divisor}, \
             hits re-ranked over k + Δ)"
        ),
        PolicyConfig::Guarded {
            alpha_l,
            alpha_t,
            tau_init_divisor,
            spread,
        } => {
            let start = if spread > 0.0 {
                format!("τ₀ from the answer's spread, c = {spread}")
            } else {
                format!("τ₀ = minD / {tau_init_divisor}")
            };
            format!(
                "guarded (α_L = {alpha_l}, α_T = {alpha_t}, {start}, an alias asked again \
                 is promoted)"
            )
        }
        PolicyConfig::Proximity { threshold } => format!("proximity (threshold {threshold})"),
        PolicyConfig::Potluck {
            threshold,
            p,
            grow,
            shrink,
            seed,
        } => format!(
            "potluck (threshold {threshold}, p = {p}, grow ×{grow}, shrink ×{shrink}, seed {seed})"
        ),
    }
}

/// One line for the console: the file and the settings that matter.
impl fmt::Display for AkerdSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: Δ = {}, k_max = {}, filter_candidates = {}, standby_search = {:?}, \
             store_vectors = {}, filter {}, policy {}, eviction {:?}, {} shards ({} centroids, router \
             sample ≤ {} rows, rebalance every {} searches for {} ms), own pool {}",
            self.path.display(),
            self.delta,
            self.k_max,
            self.filter_candidates,
            self.standby_search,
            self.store_vectors,
            self.filter,
            policy_label(&self.policy),
            self.eviction,
            self.shards,
            self.centroids,
            self.sample_rows,
            self.rebalance_every,
            self.rebalance_ms,
            capacity_label(self.capacity),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/akerd.toml")
    }

    #[test]
    fn a_metric_the_file_sets_must_be_the_run_s() {
        assert_eq!(resolve_metric(None, Metric::Cosine), Ok(Metric::Cosine));
        assert_eq!(
            resolve_metric(Some(Metric::L2Sq), Metric::L2Sq),
            Ok(Metric::L2Sq)
        );
        let e = resolve_metric(Some(Metric::L2Sq), Metric::Cosine).unwrap_err();
        assert!(e.contains("l2sq") && e.contains("--metric"), "{e}");
        // Through the file: ops/akerd.toml sets l2sq.
        let e = AkerdFile::load(&shipped(), Metric::Cosine).unwrap_err();
        assert!(
            e.contains("akerd.toml") && e.contains("cache.metric"),
            "{e}"
        );
        // Unset in the file: the run's metric.
        let unset = Config::from_toml("[cache]\ncapacity_objects = 100").unwrap();
        let f = AkerdFile::new("x.toml".into(), unset, Metric::Cosine).unwrap();
        assert_eq!(f.engine_config(8).unwrap().metric, Metric::Cosine);
    }

    #[test]
    fn the_shipped_file_is_akerd_s_configuration() {
        let f = AkerdFile::load(&shipped(), Metric::L2Sq).unwrap();
        let cfg = Config::load(&shipped()).unwrap();
        let s = f.setup(50).unwrap();
        assert_eq!(s.cache, cfg.cache.engine_config(50).unwrap());
        assert_eq!(s.policy, cfg.cache.policy);
        assert_eq!(f.shards(), 2, "executors = 1: two shards");
        let want = cfg.sharding.engine(2);
        assert_eq!(
            (s.sharding.shards, s.sharding.centroids, s.sharding.seed),
            (want.shards, want.centroids, want.seed)
        );
        assert_eq!(
            s.sharding.rebalance_every,
            ShardingConfig::default().rebalance_every
        );
        assert_eq!(s.sample_rows, cfg.sharding.sample_rows);
        let text = f.settings().to_string();
        for part in [
            "akerd.toml",
            "Δ = 2",
            "filter_candidates = 2",
            "standby_search = Learned",
            "store_vectors = false",
            "2 shards",
            "policy guarded",
            "eviction SecondChance",
            "256 MiB",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }

    #[test]
    fn capacities_read_as_people_write_them() {
        assert_eq!(capacity_label(Capacity::Bytes(256 << 20)), "256 MiB");
        assert_eq!(capacity_label(Capacity::Bytes(3 << 19)), "1.5 MiB");
        assert_eq!(capacity_label(Capacity::Bytes(1000)), "1000 B");
        assert_eq!(capacity_label(Capacity::Objects(5)), "5 objects");
    }
}
