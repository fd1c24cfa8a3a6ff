//! `[cache]`: the engine's knobs (`shards::CacheConfig`) and akerd's own (the metric's
//! source, the two capacity keys, the hit policy, the recall floor, snapshots, prefault).
//!
//! The keys are one list, [`cache_section!`]'s: each says once whether it is an engine
//! field of the same name (then it is copied into `CacheConfig` and, unless it states
//! another, takes `CacheConfig::default()`'s default) or akerd's own. From the list come
//! the struct's fields, its `Default` and the copy into `CacheConfig`, which names every
//! engine field, so that an engine field added later does not build until it is a key
//! or set by [`CacheSection::engine_config`]. serde's `flatten` would not do: it does not
//! combine with `deny_unknown_fields`, `CacheConfig` has fields that are not keys (`dim`,
//! `refresh`), and its one `capacity` is two keys here.

use serde::{Deserialize, Serialize};
use shards::floor::FloorConfig;
use shards::{CacheConfig, Capacity, Eviction, FilterKind, Metric, PolicyConfig, StandbySearch};

use crate::ConfigError;

/// Declares `[cache]`: `engine name: Type [= default];` is `CacheConfig::name` (default:
/// the engine's), `daemon name: Type = default;` is akerd's own. `$e` and `$f` name the
/// engine's and the floor's defaults for the default expressions.
macro_rules! cache_section {
    (@default engine $e:ident $field:ident) => {
        $e.$field
    };
    (@default $kind:ident $e:ident $field:ident $default:expr) => {
        $default
    };
    // The copy into `CacheConfig`: engine fields gathered, akerd's skipped.
    (@engine $s:ident [$($acc:tt)*] engine $field:ident $($rest:tt)*) => {
        cache_section!(@engine $s [$($acc)* $field: $s.$field,] $($rest)*)
    };
    (@engine $s:ident [$($acc:tt)*] daemon $field:ident $($rest:tt)*) => {
        cache_section!(@engine $s [$($acc)*] $($rest)*)
    };
    (@engine $s:ident [$($acc:tt)*]) => {
        CacheConfig { $($acc)* }
    };
    (
        $(#[$meta:meta])*
        pub struct $name:ident, defaults from (engine: $e:ident, floor: $f:ident) {
            $(
                $(#[$fmeta:meta])*
                $kind:ident $field:ident: $ty:ty $(= $default:expr)?;
            )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                let $e = CacheConfig::default();
                let $f = FloorConfig::default();
                $name { $( $field: cache_section!(@default $kind $e $field $($default)?), )* }
            }
        }

        impl $name {
            /// The engine configuration: every engine key copied, and the engine fields
            /// that are not keys as given.
            fn engine_fields(
                &self,
                dim: usize,
                metric: Metric,
                capacity: Capacity,
                refresh: bool,
            ) -> CacheConfig {
                let s = self;
                // The fields that are not keys go in first, named from here (hygiene).
                cache_section!(@engine s [dim, metric, capacity, refresh,] $($kind $field)*)
            }
        }
    };
}

cache_section! {
    /// The engine's knobs (`shards::CacheConfig`); the dimension comes from the data.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct CacheSection, defaults from (engine: e, floor: f) {
        /// `l2sq` (squared L2), `cosine` (1 - cos) or `ip` (-dot); the engine's other
        /// spellings (`l2`, `dot`, `inner_product`, ...) are accepted too. Unset: `l2sq` for
        /// the embedded and cache-aside backends; for pgvector, the operator class of the
        /// column's HNSW index (set it when the column has indexes for several metrics).
        daemon metric: Option<Metric> = None;
        /// Largest `k` a request may ask for.
        engine k_max: usize;
        /// Reserve results kept beyond k (Δ): deletes promote them instead of invalidating.
        engine delta: usize = daemon_defaults::DELTA;
        /// Pool budget in bytes (objects, representatives, aliases), over all shards.
        /// Exactly one of `capacity_bytes` / `capacity_objects`; bytes is the default.
        daemon capacity_bytes: Option<usize> = None;
        /// Pool budget in distinct neighbour objects (the paper's unit), over all shards.
        daemon capacity_objects: Option<usize> = None;
        /// Keep each neighbour's vector, so hits are re-ranked for the request's own vector.
        engine store_vectors: bool = daemon_defaults::STORE_VECTORS;
        /// `{ kind = "hnsw", m = 4, ef_construction = 8, ef_search = 16 }` or
        /// `{ kind = "brute_force" }`.
        engine filter: FilterKind;
        /// Candidates the filter returns per lookup.
        engine filter_candidates: usize;
        /// `learned` (the default here): while a rotation leaves two filter generations,
        /// the one lookups' approximate hits have been coming from is searched first and
        /// answers when it has a candidate that serves, the other is searched only
        /// otherwise; `active_first`: the same with the newer generation always first;
        /// `nearest` is ALGORITHM.md's rule (and the engine's default): the nearest serving
        /// candidate of either generation.
        engine standby_search: StandbySearch = daemon_defaults::STANDBY_SEARCH;
        /// Retired (issue #41): read and ignored, with a note (`keys::RETIRED`). Every
        /// hit checks the inserts its entry has not accounted for yet.
        daemon complete_fast_path: Option<bool> = None;
        /// `fifo` (the paper's) or `second_chance` (CLOCK: an entry hit since the hand last
        /// passed it stays).
        engine eviction: Eviction = daemon_defaults::EVICTION;
        /// Most aliases one representative links; past it, no new alias.
        /// (`max_aliases_per_rep` before.)
        #[serde(rename = "aliases_per_rep_max", alias = "max_aliases_per_rep")]
        engine max_aliases_per_rep: usize;
        /// Slow-path batch `B`: log records one step scans.
        engine slow_path_batch: usize;
        /// Most slow-path steps run after one operation, however high the risk.
        /// (`slow_path_max_steps` before.)
        #[serde(rename = "slow_path_steps_max", alias = "slow_path_max_steps")]
        engine slow_path_max_steps: usize;
        /// Risk threshold `τ_risk`.
        engine risk_threshold: f64;
        /// Most records in the insert log; an entry whose cursor falls behind is
        /// invalidated. (`insert_log_cap` before.)
        #[serde(rename = "insert_log_entries_max", alias = "insert_log_cap")]
        engine insert_log_cap: usize;
        /// Most bytes of the insert log (vectors and bookkeeping); with
        /// `insert_log_entries_max`, whichever binds first.
        engine insert_log_bytes: usize;
        /// Deletes remembered for in-flight misses; a miss older than this is not
        /// admitted. (`delete_log_cap` before.)
        #[serde(rename = "delete_log_entries_max", alias = "delete_log_cap")]
        engine delete_log_cap: usize;
        /// The newest inserts a hit checks (1..=65536): an insert acknowledged before a
        /// lookup is in its answer wherever it ranks, unless the entry is further behind
        /// than this, when the lookup is answered as a miss (docs/ALGORITHM.md, "Inserts").
        engine hit_check_records_max: usize;
        /// `{ kind = "aker", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }`,
        /// `{ kind = "guarded", alpha_l, alpha_t, tau_init_divisor, spread = 0.0 }` (Aker's
        /// rules, an alias asked again promoted: docs/ALGORITHM.md),
        /// `{ kind = "proximity", threshold = .. }` or `{ kind = "potluck", .. }`; a threshold
        /// is a gap (`shards::gap`): the metric's distance, on `ip` the angle `1 - cos`.
        daemon policy: PolicyConfig = daemon_defaults::policy();
        /// The recall@k that what akerd serves must keep, relative to the backend's own
        /// answer for the same request (over all replies; a miss counts 1): sampled hits
        /// are checked against the backend in its spare capacity, and hit thresholds are
        /// tightened while the estimate's lower bound is below it (docs/ALGORITHM.md, "The
        /// recall floor"). 0 turns it off; unavailable in cache-aside mode.
        daemon recall_floor: f64 = daemon_defaults::RECALL_FLOOR;
        /// Fraction of approximate and alias hits checked (exact hits: an eighth of it).
        daemon recall_sample: f64 = f.sample;
        /// Most checks a second over all executors; past it, sampled hits go unchecked.
        daemon recall_checks_per_s: u32 = daemon_defaults::RECALL_CHECKS_PER_S;
        /// The loosest threshold scale the floor may set: 1 keeps the policy's own
        /// thresholds as the loosest; above 1 it may loosen past them while the floor holds.
        daemon recall_scale_max: f32 = f.scale_max;
        /// Messages queued to one shard's owner; hints past it are dropped and counted,
        /// writes wait for room.
        daemon owner_queue_depth: usize = daemon_defaults::OWNER_QUEUE_DEPTH;
        /// With `backend.data_dir` (the durable store) only: the cache's warm-restart
        /// snapshot (docs/ARCHITECTURE.md, "Warm restart") is written at shutdown (SIGTERM).
        daemon snapshot_on_shutdown: bool = true;
        /// ... and every this many seconds (0: never on a timer). `POST /snapshot` on the
        /// admin endpoint writes one on demand.
        daemon snapshot_interval_s: u64 = 0;
        /// ... and loaded at start when the store's log still holds every write after it.
        daemon snapshot_load: bool = true;
        /// Memory akerd touches and frees at start (0: none), so that the cache's first
        /// growth reuses pages already faulted in (`aker_alloc::prefault`; the allocator
        /// keeps what it frees) instead of faulting each one in during an admission or an
        /// insert (~4.5 ms per 2 MB huge page on this project's VMs). Up to the cache's peak:
        /// the pool budget, its entries and filter, and the insert log. At most the
        /// machine's memory.
        daemon prefault_bytes: usize = 0;
        /// Transparent huge pages for akerd's memory: `on`, `off`, or `auto` (on when the
        /// pool budget is at least `HUGE_PAGES_AUTO_BYTES`, counting an object as 16
        /// bytes). Huge pages make big pools' lookups faster (fewer TLB misses) but round
        /// each touched 2 MiB range up: with a small pool that rounding is most of
        /// akerd's memory. `MIMALLOC_ALLOW_THP` in the environment overrides it.
        daemon huge_pages: HugePages = HugePages::Auto;
    }
}

/// `cache.huge_pages`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HugePages {
    /// On for a pool budget of at least `HUGE_PAGES_AUTO_BYTES`.
    #[default]
    Auto,
    On,
    Off,
}

/// `huge_pages = "auto"` turns them on from this pool budget: at 64 MiB the rounding
/// (11-12 MiB measured with an empty pool, `bench/results/miss-parity.md`) is under a
/// fifth of what the pool will hold.
pub const HUGE_PAGES_AUTO_BYTES: usize = 64 << 20;

/// What `capacity_objects` counts an object as for `huge_pages = "auto"`: its id and
/// the distance kept with it, the least an object costs.
const OBJECT_BYTES_LEAST: usize = 16;

impl CacheSection {
    /// Whether akerd keeps transparent huge pages (`cache.huge_pages`).
    pub fn huge_pages_on(&self) -> Result<bool, ConfigError> {
        Ok(match self.huge_pages {
            HugePages::On => true,
            HugePages::Off => false,
            HugePages::Auto => {
                let bytes = match self.capacity()? {
                    Capacity::Bytes(b) => b,
                    Capacity::Objects(o) => o.saturating_mul(OBJECT_BYTES_LEAST),
                };
                bytes >= HUGE_PAGES_AUTO_BYTES
            }
        })
    }
}

/// akerd's deliberate departures from the engine's defaults, named here and nowhere
/// else: every other `[cache]` default is `shards::CacheConfig::default()`'s, and
/// `ops/akerd.toml` states them all (a test holds it to that).
pub mod daemon_defaults {
    use shards::{Eviction, PolicyConfig, StandbySearch};

    /// Δ = 2 reserve results (engine: 0, the paper's search runs): a delete of a cached
    /// neighbour promotes a reserve instead of invalidating the entry, which a daemon
    /// that takes writes needs; 2, not more, because at equal bytes each reserve costs
    /// entries (GloVe 5%, skew 0.99: Δ 0 / 2 / 10 hold 5,253 / 4,716 / 3,457 entries,
    /// 67.6 / 66.2 / 61.6% hits: bench/results/policy-frontier.md).
    pub const DELTA: usize = 2;
    /// Neighbour vectors are not kept (engine: kept): at d = 50 a vector costs three
    /// ids-only objects, and with the guarded policy re-ranking them bought less than
    /// the entries they displace (policy-frontier.md, "akerd's configuration").
    pub const STORE_VECTORS: bool = false;
    /// Second-chance eviction (engine: FIFO, the paper's): an entry hit since the clock
    /// hand last passed it is spared, so a popular query keeps its exact answer.
    pub const EVICTION: Eviction = Eviction::SecondChance;
    /// The guarded policy (engine: paper-Aker): paper-Aker's thresholds, and an alias
    /// asked for again is promoted to an entry of its own (docs/ALGORITHM.md, "The
    /// guarded policy").
    pub fn policy() -> PolicyConfig {
        PolicyConfig::Guarded {
            alpha_l: 1.1,
            alpha_t: 0.25,
            tau_init_divisor: 4.0,
            spread: 0.0,
        }
    }
    /// `learned` (engine: `nearest`, ALGORITHM.md's rule): after a filter rotation, the
    /// generation hits come from is searched first and answers alone when it can
    /// (two-generation hits 25.9 -> 18.5 µs at d = 768, hit ratios within 0.1 point:
    /// docs/ARCHITECTURE.md, "The query filter").
    pub const STANDBY_SEARCH: StandbySearch = StandbySearch::Learned;
    /// The pool budget is bytes, 256 MiB (engine: objects, the paper's unit): an
    /// operator sizes memory, not neighbour counts.
    pub const CAPACITY_BYTES: usize = 256 << 20;
    /// Messages queued per shard owner (daemon-only).
    pub const OWNER_QUEUE_DEPTH: usize = 4096;
    /// The recall floor is on at 0.95 (engine: off): the default policy measures
    /// 0.97-0.99 on GloVe at equal bytes (bench/results/policy-frontier.md), so there
    /// the floor only costs its checks, and it catches a workload or a policy that does
    /// worse (paper-Aker: 0.92 at skew 0.99) instead of serving it silently.
    pub const RECALL_FLOOR: f64 = 0.95;
    /// Checks a second at most: ~1-3% of what one backend thread answers here, and
    /// enough for the estimate to follow a changed workload within seconds.
    pub const RECALL_CHECKS_PER_S: u32 = 200;
}

/// Default pool budget when neither capacity key is set.
pub const DEFAULT_CAPACITY_BYTES: usize = daemon_defaults::CAPACITY_BYTES;

impl CacheSection {
    /// The configured metric, or the engine's default (`l2sq`).
    pub fn metric_or_default(&self) -> Metric {
        self.metric.unwrap_or(CacheConfig::default().metric)
    }

    /// The pool budget: one of the two capacity keys, or the default bytes.
    pub fn capacity(&self) -> Result<Capacity, ConfigError> {
        Ok(match (self.capacity_bytes, self.capacity_objects) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::invalid(
                    "cache",
                    "set capacity_bytes or capacity_objects, not both",
                ))
            }
            (Some(b), None) => Capacity::Bytes(b),
            (None, Some(o)) => Capacity::Objects(o),
            (None, None) => Capacity::Bytes(DEFAULT_CAPACITY_BYTES),
        })
    }

    /// The engine configuration for a collection of dimension `dim`.
    pub fn engine_config(&self, dim: usize) -> Result<CacheConfig, ConfigError> {
        let cache = |e: String| ConfigError::invalid("cache", e);
        // The no-refresh ablation is the runner's (`bench updates`), not a daemon's.
        let cfg = self.engine_fields(dim, self.metric_or_default(), self.capacity()?, true);
        cfg.validate().map_err(|e| cache(e.to_string()))?;
        self.policy.validate(cfg.metric).map_err(cache)?;
        if self.owner_queue_depth == 0 {
            return Err(ConfigError::invalid(
                "cache.owner_queue_depth",
                "must be at least 1",
            ));
        }
        self.floor_config().validate().map_err(cache)?;
        if self.recall_checks_per_s == 0 {
            return Err(ConfigError::invalid(
                "cache.recall_checks_per_s",
                "must be at least 1",
            ));
        }
        Ok(cfg)
    }

    /// The engine's recall-floor settings (`shards::floor`).
    pub fn floor_config(&self) -> FloorConfig {
        FloorConfig {
            floor: self.recall_floor,
            sample: self.recall_sample,
            scale_max: self.recall_scale_max,
            ..FloorConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list's defaults are the engine's but for `daemon_defaults`, field by field.
    #[test]
    fn the_engine_keys_default_to_the_engine_s_values_but_for_akerd_s_departures() {
        let got = CacheSection::default().engine_config(8).unwrap();
        let want = CacheConfig {
            dim: 8,
            capacity: Capacity::Bytes(DEFAULT_CAPACITY_BYTES),
            delta: daemon_defaults::DELTA,
            store_vectors: daemon_defaults::STORE_VECTORS,
            eviction: daemon_defaults::EVICTION,
            standby_search: daemon_defaults::STANDBY_SEARCH,
            ..CacheConfig::default()
        };
        assert_eq!(got, want);
    }

    #[test]
    fn every_engine_key_reaches_the_engine() {
        let text = "k_max = 7\ndelta = 3\nstore_vectors = true\n\
                    filter = { kind = \"brute_force\" }\nfilter_candidates = 3\n\
                    standby_search = \"nearest\"\n\
                    eviction = \"fifo\"\naliases_per_rep_max = 9\nslow_path_batch = 5\n\
                    slow_path_steps_max = 6\nrisk_threshold = 0.5\n\
                    insert_log_entries_max = 1000\ninsert_log_bytes = 100000\n\
                    delete_log_entries_max = 77\nhit_check_records_max = 33\n\
                    capacity_objects = 50\nmetric = \"cosine\"\n";
        let s: CacheSection = toml::from_str(text).unwrap();
        let got = s.engine_config(4).unwrap();
        let want = CacheConfig {
            dim: 4,
            metric: Metric::Cosine,
            k_max: 7,
            delta: 3,
            capacity: Capacity::Objects(50),
            store_vectors: true,
            filter: FilterKind::BruteForce,
            filter_candidates: 3,
            standby_search: StandbySearch::Nearest,
            eviction: Eviction::Fifo,
            max_aliases_per_rep: 9,
            slow_path_batch: 5,
            slow_path_max_steps: 6,
            risk_threshold: 0.5,
            insert_log_cap: 1000,
            insert_log_bytes: 100_000,
            delete_log_cap: 77,
            hit_check_records_max: 33,
            refresh: true,
        };
        assert_eq!(got, want);
    }
}
