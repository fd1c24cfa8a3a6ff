//! Engine configuration: every knob of ALGORITHM.md, with the paper's defaults.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::metric::Metric;

/// What the pool budget counts (ALGORITHM.md: "Pool capacity counts distinct objects;
/// the server's budget is in bytes").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capacity {
    /// Distinct neighbour objects (the paper's unit).
    Objects(usize),
    /// Bytes of everything the cache holds: objects, representatives, aliases.
    Bytes(usize),
}

/// Which index serves the query filter.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum FilterKind {
    /// The engine's own lock-free HNSW graph (`filter/graph.rs`), the default.
    Hnsw {
        m: usize,
        ef_construction: usize,
        ef_search: usize,
    },
    /// hnsw_rs over the SIMD kernel, as the authors' artifact does: kept to measure
    /// the graph against (`bench/benches/engine.rs`).
    HnswRs {
        m: usize,
        ef_construction: usize,
        ef_search: usize,
    },
    /// Exact scan: for tests and faithfulness runs.
    BruteForce,
}

impl FilterKind {
    /// The paper's filter parameters (§4.7: m = 4, ef_construction = 8, ef_search = 16).
    pub const PAPER: (usize, usize, usize) = (4, 8, 16);

    /// (m, ef_construction, ef_search) of a graph filter.
    pub fn graph_params(self) -> Option<(usize, usize, usize)> {
        match self {
            FilterKind::Hnsw {
                m,
                ef_construction,
                ef_search,
            }
            | FilterKind::HnswRs {
                m,
                ef_construction,
                ef_search,
            } => Some((m, ef_construction, ef_search)),
            FilterKind::BruteForce => None,
        }
    }
}

impl std::fmt::Display for FilterKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            FilterKind::Hnsw {
                m,
                ef_construction,
                ef_search,
            } => write!(
                f,
                "graph HNSW m {m}, efc {ef_construction}, efs {ef_search}"
            ),
            FilterKind::HnswRs {
                m,
                ef_construction,
                ef_search,
            } => write!(f, "hnsw_rs m {m}, efc {ef_construction}, efs {ef_search}"),
            FilterKind::BruteForce => write!(f, "brute force"),
        }
    }
}

/// Which representative leaves when the pool is over budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Eviction {
    /// The oldest (§4.7): the paper's rule.
    #[default]
    Fifo,
    /// The oldest not hit since the clock hand last passed it (CLOCK): an entry that
    /// serves hits stays while one-off misses age out. Beyond the paper (#22).
    SecondChance,
}

/// Which of several filter generations answers (the module docs of `filter`: between a
/// rotation and the standby's emptying there are two).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StandbySearch {
    /// ALGORITHM.md: the nearest candidate over every generation. The older ones are
    /// searched only for what lies nearer than the active generation's nearest
    /// candidate that serves, which still costs each of them a descent.
    #[default]
    Nearest,
    /// The newest generation that has a candidate which serves answers: older ones are
    /// searched only when it has none (a lookup: a candidate within its threshold; the
    /// insert fast path: one whose `maxD` takes the vector). With two generations an
    /// answer from a recent entry then costs what it costs with one. GloVe: hit ratios
    /// within 0.34 points of `Nearest`, recall up to 0.52 points lower (README).
    ActiveFirst,
    /// As `ActiveFirst`, but the generation searched first is the one lookups' approximate
    /// hits have been coming from (`filter::GenerationOrder`): the active one while hits
    /// land on recent entries, the standby while it holds most of what is hit (after a
    /// rotation it holds nearly every entry). Either way the first generation with a
    /// candidate that serves answers. GloVe: hit ratios and recall within 0.12 points of
    /// `Nearest` (README). The owner's searches (the insert fast path) keep the active
    /// generation first.
    Learned,
}

impl Default for FilterKind {
    fn default() -> Self {
        FilterKind::Hnsw {
            m: 4,
            ef_construction: 8,
            ef_search: 16,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CacheConfig {
    pub dim: usize,
    pub metric: Metric,
    /// Largest `k` a request may ask for.
    pub k_max: usize,
    /// Reserve results kept beyond `k` (Δ).
    pub delta: usize,
    pub capacity: Capacity,
    /// Keep each neighbour's vector, so hits are re-ranked for the request's own vector.
    pub store_vectors: bool,
    pub filter: FilterKind,
    /// Candidates the filter returns per lookup (ALGORITHM.md: "nearest 1–2").
    pub filter_candidates: usize,
    /// Which filter generation answers while there are two (`StandbySearch`).
    pub standby_search: StandbySearch,
    /// Which representative leaves when the pool is over budget (`Eviction`).
    pub eviction: Eviction,
    /// Most aliases one representative links; past it, no new alias (its memory is bounded).
    pub max_aliases_per_rep: usize,
    /// Slow-path batch `B`: log records one step scans.
    pub slow_path_batch: usize,
    /// Most slow-path steps run after one operation, however high the risk.
    pub slow_path_max_steps: usize,
    /// Risk threshold `τ_risk`.
    pub risk_threshold: f64,
    /// Most records in the insert log; an entry whose cursor falls behind is invalidated.
    pub insert_log_cap: usize,
    /// Most bytes the insert log may hold, its vectors and per-record bookkeeping
    /// (`LOG_RECORD_OVERHEAD_BYTES`): whichever of this and `insert_log_cap` binds first
    /// (`insert_log_records_max`). A cap in records alone is 3 GB of vectors at
    /// d = 768, outside the pool's budget.
    pub insert_log_bytes: usize,
    /// Deletes remembered for in-flight misses; a miss older than this is not admitted.
    pub delete_log_cap: usize,
    /// The newest insert-log records readers may check at hit time (`recent.rs`): a hit
    /// on an entry whose cursor is behind the log adds the records since that it takes,
    /// so an acknowledged insert is in every hit it belongs in. An entry further behind
    /// than this answers as a miss (and asks its owner to catch it up). The insert log
    /// keeps at least this many records (a miss's ticket older than them is not
    /// admitted: `Admission::Stale`).
    pub hit_check_records_max: usize,
    /// Refresh on writes (§4.6), on by default. Off is the paper's no-refresh ablation
    /// (AK-RD, §5.4): an insert reaches no entry (no log, no fast or slow path), and a
    /// delete drops every entry listing the id, whatever its reserve (no promotion);
    /// the next lookup there misses. Del-consistency holds either way; only entries go
    /// stale (inserts missing) and fewer survive deletes.
    pub refresh: bool,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            dim: 0,
            metric: Metric::L2Sq,
            k_max: 100,
            delta: 0,
            capacity: Capacity::Objects(10_000),
            store_vectors: true,
            filter: FilterKind::default(),
            filter_candidates: 2,
            standby_search: StandbySearch::Nearest,
            eviction: Eviction::Fifo,
            max_aliases_per_rep: 256,
            slow_path_batch: 16,
            slow_path_max_steps: 64,
            risk_threshold: 0.3,
            insert_log_cap: 1 << 20,
            insert_log_bytes: 1 << 30,
            delete_log_cap: 1 << 16,
            hit_check_records_max: 1024,
            refresh: true,
        }
    }
}

/// What one insert-log record costs beyond its vector: the record (sequence number,
/// id, vector pointer), the vector's allocation header, the by-id index's share.
pub const LOG_RECORD_OVERHEAD_BYTES: usize = 64;

impl CacheConfig {
    pub fn new(dim: usize, metric: Metric) -> Self {
        CacheConfig {
            dim,
            metric,
            ..Default::default()
        }
    }

    /// Bytes one insert-log record takes (its vector and `LOG_RECORD_OVERHEAD_BYTES`).
    pub fn log_record_bytes(&self) -> usize {
        self.dim * std::mem::size_of::<f32>() + LOG_RECORD_OVERHEAD_BYTES
    }

    /// Most records the insert log holds: `insert_log_cap`, or fewer where
    /// `insert_log_bytes` binds first (every record of a cache has the same dimension).
    pub fn insert_log_records_max(&self) -> usize {
        self.insert_log_cap
            .min(self.insert_log_bytes / self.log_record_bytes())
            .max(1)
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Config(m.to_string()));
        if self.dim == 0 || self.dim > 65_536 {
            return bad("dim must be in 1..=65536");
        }
        if self.k_max == 0 || self.k_max > 10_000 {
            return bad("k_max must be in 1..=10000");
        }
        if self.delta > 10_000 {
            return bad("delta must be at most 10000");
        }
        match self.capacity {
            Capacity::Objects(0) | Capacity::Bytes(0) => return bad("capacity must be positive"),
            _ => {}
        }
        if self.filter_candidates == 0 || self.filter_candidates > 64 {
            return bad("filter_candidates must be in 1..=64");
        }
        if self.slow_path_batch == 0 {
            return bad("slow_path_batch must be positive");
        }
        if !(self.risk_threshold.is_finite() && self.risk_threshold > 0.0) {
            return bad("risk_threshold must be positive");
        }
        if self.insert_log_cap == 0 || self.delete_log_cap == 0 {
            return bad("log caps must be positive");
        }
        if self.hit_check_records_max == 0 || self.hit_check_records_max > 1 << 16 {
            return bad("hit_check_records_max must be in 1..=65536");
        }
        if self.insert_log_bytes < self.log_record_bytes() {
            return bad("insert_log_bytes must hold at least one record (dim x 4 + 64 bytes)");
        }
        if let Some((m, ef_construction, ef_search)) = self.filter.graph_params() {
            if !(2..=256).contains(&m) || ef_construction == 0 || ef_search == 0 {
                return bad("hnsw filter: m in 2..=256, ef_construction and ef_search positive");
            }
        }
        Ok(())
    }
}
