//! The core of the recall experiment (paper §5.2, Figures 10 and 11): replay one
//! simZipf stream through one cache configuration and score every answer against the
//! exact neighbours. Also the two calibrations the baselines need: Proximity+'s global
//! threshold (a percentile of inter-query distances) and the HNSW backend's `ef` (the
//! smallest reaching a target recall without a cache).

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shards::entry::RepView;
use shards::filter::FilterQuery;
use shards::floor::{recall_at_k, FloorConfig, FloorEstimate, RecallFloor, ServedTotals};
use shards::gap::Gauge;
use shards::sharded::{ShardedCache, ShardingConfig};
use shards::store::HnswStore;
use shards::{
    Backend, Cache, CacheConfig, CacheStats, Capacity, Error, Eviction, FilterKind, HitKind,
    HitPolicy, Metric, PolicyConfig, Result, SearchOutcome, StandbySearch,
};

use crate::akerd::AkerdSetup;
use crate::workload::Workload;

/// The hit rule of a configuration; `NoCache` sends every request to the backend.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// The paper's per-entry thresholds (α_L = 1.1, α_T = 0.25, τ₀ = minD / 4).
    Aker,
    /// Proximity+: one fixed global threshold.
    Proximity,
    /// Potluck+: one global threshold, verified on a share `p` of hits.
    Potluck {
        p: f64,
    },
    NoCache,
    /// akerd's effective configuration (`--akerd-config`): the file's `[cache]` and
    /// `[sharding]`, its policy, filter and shards (`RunSpec::akerd`).
    Akerd,
    /// The paper's rules with another start `τ₀ = minD / divisor` and shrink `α_T`
    /// (`aker:div=16:at=0.5`: paper-Aker's frontier), or the guarded policy with them
    /// (`guarded:div=8`; `shards::PolicyConfig::Guarded`).
    Tuned {
        guarded: bool,
        divisor: f32,
        alpha_t: f32,
        /// `spread=C` (guarded only): τ₀ from the answer's spread (`AkerPolicy::spread`).
        spread: f32,
        /// `:clock`: second-chance eviction instead of FIFO (`shards::Eviction`).
        clock: bool,
    },
}

/// `div=D` / `at=A` pairs after a `aker:` or `guarded:` name (any order, either left out
/// for the paper's 4 / 0.25).
fn tuned(guarded: bool, params: &str) -> Result<Rule, String> {
    let (mut divisor, mut alpha_t, mut spread, mut clock) = (4.0f32, 0.25f32, 0.0f32, false);
    for kv in params.split(':').filter(|s| !s.is_empty()) {
        if kv == "clock" {
            clock = true;
            continue;
        }
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("policy parameter '{kv}' is not key=value"))?;
        let v: f32 = v
            .parse()
            .map_err(|e| format!("policy parameter '{kv}': {e}"))?;
        match k {
            "div" => divisor = v,
            "at" => alpha_t = v,
            "spread" if guarded && v > 0.0 && v.is_finite() => spread = v,
            _ => {
                return Err(format!(
                    "policy parameter '{kv}' (div, at; guarded also spread > 0)"
                ))
            }
        }
    }
    let rule = Rule::Tuned {
        guarded,
        divisor,
        alpha_t,
        spread,
        clock,
    };
    let config = PolicyConfig::Aker {
        alpha_l: 1.1,
        alpha_t,
        tau_init_divisor: divisor,
    };
    config.validate(Metric::L2Sq)?;
    Ok(rule)
}

/// A policy column of the report: a hit rule and the query filter it runs with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    pub rule: Rule,
    /// `true`: exact-scan filter; `false`: the paper's HNSW filter (m 4, efc 8, efs 16).
    pub brute_force_filter: bool,
}

impl Policy {
    pub fn filter(&self) -> FilterKind {
        if self.brute_force_filter {
            FilterKind::BruteForce
        } else {
            FilterKind::default()
        }
    }
}

/// Names as the CLI takes them: `aker`, `prx`, `pl10`, `pl25` (any `plNN`: p = NN %),
/// `none`, `akerd`; a `-bf` suffix selects the brute-force filter.
impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        let lower = s.trim().to_ascii_lowercase();
        let (name, brute_force_filter) = match lower.strip_suffix("-bf") {
            Some(n) => (n, true),
            None => (lower.as_str(), false),
        };
        let rule = match name {
            "aker" => Rule::Aker,
            "prx" | "proximity" => Rule::Proximity,
            "none" | "nocache" => Rule::NoCache,
            "akerd" => Rule::Akerd,
            "guarded" => tuned(true, "")?,
            _ if name.starts_with("aker:") => tuned(false, &name["aker:".len()..])?,
            _ if name.starts_with("guarded:") => tuned(true, &name["guarded:".len()..])?,
            _ => match name.strip_prefix("pl").map(str::parse::<u32>) {
                Some(Ok(pct)) if (1..=100).contains(&pct) => Rule::Potluck {
                    p: f64::from(pct) / 100.0,
                },
                _ => {
                    return Err(format!(
                        "unknown policy '{s}' (aker, aker:div=D:at=A, guarded[:div=D:at=A], prx, pl10, pl25, none; -bf suffix: brute-force filter)"
                    ))
                }
            },
        };
        if rule == Rule::NoCache && brute_force_filter {
            return Err("'none' has no filter".into());
        }
        if rule == Rule::Akerd && brute_force_filter {
            return Err("'akerd' runs the file's own filter (cache.filter)".into());
        }
        Ok(Policy {
            rule,
            brute_force_filter,
        })
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.rule {
            Rule::Aker => write!(f, "aker")?,
            Rule::Proximity => write!(f, "prx")?,
            Rule::Potluck { p } => write!(f, "pl{}", (p * 100.0).round())?,
            Rule::NoCache => return write!(f, "none"),
            Rule::Akerd => return write!(f, "akerd"),
            Rule::Tuned {
                guarded,
                divisor,
                alpha_t,
                spread,
                clock,
            } => {
                let name = if guarded { "guarded" } else { "aker" };
                write!(f, "{name}:div={divisor}:at={alpha_t}")?;
                // The divisor stays in the label: it is the spread start's fallback.
                if spread > 0.0 {
                    write!(f, ":spread={spread}")?
                }
                if clock {
                    write!(f, ":clock")?
                }
            }
        }
        if self.brute_force_filter {
            write!(f, "-bf")?;
        }
        Ok(())
    }
}

/// Potluck+'s default threshold factors (ALGORITHM.md): the paper gives none, so the
/// ones used are reported.
pub const POTLUCK_GROW: f32 = 1.1;
pub const POTLUCK_SHRINK: f32 = 0.5;

/// One run: a policy at a pool size over a stream.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub policy: Policy,
    /// The pool budget: in distinct neighbour objects for every `--pools` share (akerd
    /// rows included, so that rows compare at the same object count); the akerd file's
    /// own for `--pools config`.
    pub pool: Capacity,
    pub k: usize,
    /// Reserve results per entry (Δ).
    pub delta: usize,
    /// Proximity+'s fixed threshold and Potluck+'s starting one (metric units).
    pub global_threshold: f32,
    /// Potluck+'s threshold factors after a verified match / mismatch.
    pub potluck_grow: f32,
    pub potluck_shrink: f32,
    pub potluck_seed: u64,
    /// Filter candidates checked against their thresholds per lookup. 1 is the paper's
    /// rule (§4.7: "selects the closest candidate cache entry"); the engine's default
    /// of 2 also tries the second nearest, which is more permissive.
    pub filter_candidates: usize,
    /// Which filter generation answers while there are two (`shards::StandbySearch`).
    pub standby_search: StandbySearch,
    /// 1: one unsharded `Cache`; more: akerd's sharded path (`shards::sharded`).
    pub shards: usize,
    /// akerd's configuration, for `Rule::Akerd` (the paper's settings above are then
    /// unused, `k` and the pool excepted).
    pub akerd: Option<AkerdSetup>,
    /// The recall floor (`shards::floor`): sampled shadow checks of hits against the
    /// backend drive the controller that scales the cache's hit thresholds. `None`:
    /// no shadow checks, the run as before.
    pub floor: Option<FloorSpec>,
    /// Also score every request against the backend's own answer for it (the floor's
    /// reference: with an approximate backend, the loss the cache adds on top of it).
    /// The backend calls this takes are measurement, counted nowhere.
    pub relative: bool,
    /// Requests per window of `RunResult::series`; 0 records none.
    pub window: usize,
}

/// A run's recall floor: its settings and the seed of its shadow-check sampling.
#[derive(Clone, Debug, PartialEq)]
pub struct FloorSpec {
    pub config: FloorConfig,
    pub seed: u64,
}

impl RunSpec {
    fn akerd(&self) -> Result<&AkerdSetup> {
        self.akerd
            .as_ref()
            .ok_or_else(|| Error::Config("an akerd row needs --akerd-config".into()))
    }

    /// The engine configuration of this run's cache for a `dim`-d collection under
    /// `metric` (the backend's). The paper configuration: Δ, filter candidates and
    /// standby search as given, the policy's filter, ids-only objects. An akerd row:
    /// exactly the file's `cache.engine_config(dim)` but for the capacity, `self.pool`.
    pub fn cache_config(&self, dim: usize, metric: Metric) -> Result<CacheConfig> {
        if self.policy.rule == Rule::Akerd {
            let a = self.akerd()?;
            if (a.cache.dim, a.cache.metric) != (dim, metric) {
                return Err(Error::Config(format!(
                    "akerd config for {}-d {}, the backend is {dim}-d {metric}",
                    a.cache.dim, a.cache.metric
                )));
            }
            return Ok(CacheConfig {
                capacity: self.pool,
                ..a.cache.clone()
            });
        }
        Ok(CacheConfig {
            delta: self.delta,
            capacity: self.pool,
            filter: self.policy.filter(),
            filter_candidates: self.filter_candidates,
            standby_search: self.standby_search,
            eviction: match self.policy.rule {
                Rule::Tuned { clock: true, .. } => Eviction::SecondChance,
                _ => Eviction::Fifo,
            },
            k_max: self.k.max(100),
            // Ids-only objects, as in the reference simulation (ALGORITHM.md): no
            // policy here re-ranks with stored vectors.
            store_vectors: false,
            ..CacheConfig::new(dim, metric)
        })
    }

    fn policy_config(&self) -> Result<PolicyConfig> {
        Ok(match self.policy.rule {
            Rule::Akerd => self.akerd()?.policy.clone(),
            Rule::Aker | Rule::NoCache => PolicyConfig::default(),
            Rule::Tuned {
                guarded: false,
                divisor,
                alpha_t,
                ..
            } => PolicyConfig::Aker {
                alpha_l: 1.1,
                alpha_t,
                tau_init_divisor: divisor,
            },
            Rule::Tuned {
                guarded: true,
                divisor,
                alpha_t,
                spread,
                ..
            } => PolicyConfig::Guarded {
                alpha_l: 1.1,
                alpha_t,
                tau_init_divisor: divisor,
                spread,
            },
            Rule::Proximity => PolicyConfig::Proximity {
                threshold: self.global_threshold,
            },
            Rule::Potluck { p } => PolicyConfig::Potluck {
                threshold: self.global_threshold,
                p,
                grow: self.potluck_grow,
                shrink: self.potluck_shrink,
                seed: self.potluck_seed,
            },
        })
    }

    /// The global threshold the run's policy uses (Proximity+'s) or starts from
    /// (Potluck+'s); `None` for the per-entry rules.
    pub fn global_threshold_used(&self) -> Option<f32> {
        match self.policy_config().ok()? {
            PolicyConfig::Proximity { threshold } | PolicyConfig::Potluck { threshold, .. } => {
                Some(threshold)
            }
            PolicyConfig::Aker { .. }
            | PolicyConfig::AkerRerank { .. }
            | PolicyConfig::Guarded { .. } => None,
        }
    }

    /// The query filter the run's cache uses; `None` without a cache.
    pub fn filter_used(&self) -> Option<FilterKind> {
        match self.policy.rule {
            Rule::NoCache => None,
            Rule::Akerd => self.akerd.as_ref().map(|a| a.cache.filter),
            _ => Some(self.policy.filter()),
        }
    }
}

/// A policy that learns from each sampled verification exactly once. `Cache::search`
/// reports a verification's outcome twice (from `resolve_miss` and again from `admit`),
/// which would square Potluck+'s factors; this forwards one outcome per sampled
/// verification and is a plain pass-through when the engine reports it once.
pub struct OncePerVerification {
    inner: Box<dyn HitPolicy>,
    /// Verifications sampled whose outcome has not been passed on yet.
    pending: AtomicU64,
}

impl OncePerVerification {
    pub fn new(inner: Box<dyn HitPolicy>) -> OncePerVerification {
        OncePerVerification {
            inner,
            pending: AtomicU64::new(0),
        }
    }
}

impl HitPolicy for OncePerVerification {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn initial_tau(&self, min_gap: f32, kth: Option<(usize, f32)>) -> f32 {
        self.inner.initial_tau(min_gap, kth)
    }
    fn threshold(&self, rep: &RepView) -> f32 {
        self.inner.threshold(rep)
    }
    fn on_equality_hit(&self, rep: &RepView) {
        self.inner.on_equality_hit(rep)
    }
    fn on_approximate_hit(&self, rep: &RepView) {
        self.inner.on_approximate_hit(rep)
    }
    fn links_aliases(&self) -> bool {
        self.inner.links_aliases()
    }
    fn sample_verification(&self) -> bool {
        let sampled = self.inner.sample_verification();
        if sampled {
            self.pending.fetch_add(1, Ordering::Relaxed);
        }
        sampled
    }
    fn on_verification(&self, cached: &[u64], fresh: &[u64]) {
        let claimed = self
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| p.checked_sub(1));
        if claimed.is_ok() {
            self.inner.on_verification(cached, fresh);
        }
    }
    fn rerank(&self) -> bool {
        self.inner.rerank()
    }
    fn promotes_aliases(&self) -> bool {
        self.inner.promotes_aliases()
    }
}

/// Counts and recall sums of one hit kind.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KindTally {
    pub count: u64,
    pub recall_sum: f64,
    /// Requests of this kind whose recall was below 0.8.
    pub below_08: u64,
}

impl KindTally {
    fn add(&mut self, recall: f64) {
        self.count += 1;
        self.recall_sum += recall;
        if recall < 0.8 {
            self.below_08 += 1;
        }
    }

    /// Mean recall, `NaN` when there was none of this kind.
    pub fn mean_recall(&self) -> f64 {
        self.recall_sum / self.count as f64
    }

    pub fn share_below_08(&self) -> f64 {
        self.below_08 as f64 / self.count as f64
    }
}

/// What one run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunResult {
    pub requests: u64,
    pub exact: KindTally,
    pub alias: KindTally,
    pub approximate: KindTally,
    pub miss: KindTally,
    /// Misses that were Potluck+ verifications (included in `miss`).
    pub verifications: u64,
    pub representatives: usize,
    pub aliases: usize,
    pub objects: usize,
    /// Bytes the pool and its entries take at the end (`CacheStats::bytes`: objects,
    /// representatives, aliases), what a byte budget counts.
    pub bytes: usize,
    pub evictions: u64,
    pub seconds: f64,
    /// Sum over requests of recall@k against the backend's own answer for the request
    /// (`RunSpec::relative`); `None` when not measured.
    pub relative_sum: Option<f64>,
    /// Backend searches the floor's shadow checks made (not in `backend_calls`).
    pub shadow_calls: u64,
    /// The floor at the end of the run (`RunSpec::floor`).
    pub floor: Option<FloorOutcome>,
    /// Per window of `RunSpec::window` requests (the last one may be shorter).
    pub series: Vec<WindowPoint>,
    /// Inserts timed on the cache the replay left (`insert_probe`); `None` without a cache.
    pub inserts: Option<InsertProbe>,
}

/// What inserts cost on the cache a run left behind, timed one by one in the engine
/// after the run's other figures were taken (its recall and hit ratio do not see them).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct InsertProbe {
    /// Each 1e-3 (Euclidean) from one of the trace's queries: where cached entries take it.
    pub near: InsertCost,
    /// Copies of collection rows (the routing sample) under new ids.
    pub rows: InsertCost,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct InsertCost {
    pub inserts: usize,
    /// Median and 99th percentile of one insert (`Cache::insert`: log, fast path and the
    /// slow-path steps it runs), µs.
    pub us_p50: f64,
    pub us_p99: f64,
    /// Lists the fast path put the vector in, per insert (mean).
    pub takers_mean: f64,
}

/// Inserts of each kind `insert_probe` times.
pub const INSERT_PROBE: usize = 500;

/// Where a run's recall floor ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FloorOutcome {
    pub config_floor: f64,
    pub sample: f64,
    pub estimate: FloorEstimate,
}

/// One window of a run's requests, and the floor's state at its end.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WindowPoint {
    /// Requests done at the window's end.
    pub end: u64,
    pub requests: u64,
    /// Recall@k against exact neighbours, summed over the window's requests.
    pub recall_sum: f64,
    /// Against the backend's own answers (`RunSpec::relative`).
    pub relative_sum: Option<f64>,
    pub hits: u64,
    pub shadow_calls: u64,
    /// The floor's estimate, its bounds, scale and state at the window's end.
    pub estimate: Option<(f64, f64, f64)>,
    pub scale: f32,
    pub state: Option<&'static str>,
}

impl WindowPoint {
    pub fn recall(&self) -> f64 {
        self.recall_sum / self.requests as f64
    }

    pub fn relative(&self) -> Option<f64> {
        self.relative_sum.map(|s| s / self.requests as f64)
    }

    pub fn hit_ratio(&self) -> f64 {
        self.hits as f64 / self.requests as f64
    }
}

impl RunResult {
    /// Mean recall@k over all requests.
    pub fn recall(&self) -> f64 {
        let sum = self.exact.recall_sum
            + self.alias.recall_sum
            + self.approximate.recall_sum
            + self.miss.recall_sum;
        sum / self.requests as f64
    }

    pub fn hits(&self) -> u64 {
        self.exact.count + self.alias.count + self.approximate.count
    }

    pub fn ratio(&self, count: u64) -> f64 {
        count as f64 / self.requests as f64
    }

    /// Every miss is exactly one backend search (verifications included); the floor's
    /// shadow checks are `shadow_calls`.
    pub fn backend_calls(&self) -> u64 {
        self.miss.count
    }

    /// Mean recall@k against the backend's own answers (`RunSpec::relative`).
    pub fn relative_recall(&self) -> Option<f64> {
        self.relative_sum.map(|s| s / self.requests as f64)
    }

    /// The share of the backend's searches that were shadow checks.
    pub fn shadow_share(&self) -> f64 {
        let all = self.backend_calls() + self.shadow_calls;
        if all == 0 {
            0.0
        } else {
            self.shadow_calls as f64 / all as f64
        }
    }

    /// The series' windows from request `from` on, merged (exact where `from` is a
    /// window's start); `None` when no window ends after it.
    pub fn recall_since(&self, from: u64) -> Option<WindowPoint> {
        let mut w = WindowPoint::default();
        for p in self.series.iter().filter(|p| p.end > from) {
            w.end = p.end;
            w.requests += p.requests;
            w.recall_sum += p.recall_sum;
            w.relative_sum = p.relative_sum.map(|s| s + w.relative_sum.unwrap_or(0.0));
            w.hits += p.hits;
            w.shadow_calls += p.shadow_calls;
        }
        (w.requests > 0).then_some(w)
    }
}

/// `|got ∩ truth| / |truth|` over ids (lists of at most a few dozen: a scan is fastest).
pub fn recall_at(got: impl IntoIterator<Item = u64>, truth: &[u64]) -> f64 {
    if truth.is_empty() {
        return 1.0;
    }
    let found = got.into_iter().filter(|id| truth.contains(id)).count();
    found as f64 / truth.len() as f64
}

/// Most collection rows the sharded path's centroids train on (akerd's
/// `sharding.sample_rows` default; `Dataset::sample` strides them as akerd does).
pub const ROUTING_SAMPLE_ROWS: usize = 20_000;

/// The cache a run replays through: one, or akerd's shards.
#[allow(clippy::large_enum_variant)] // one per run, never moved in a loop
enum CacheUnderTest {
    One(Cache),
    Sharded(ShardedCache),
}

impl CacheUnderTest {
    fn search(&mut self, backend: &dyn Backend, q: &[f32], k: usize) -> Result<SearchOutcome> {
        match self {
            CacheUnderTest::One(c) => c.search(backend, q, k),
            CacheUnderTest::Sharded(c) => c.search(backend, q, k),
        }
    }

    fn stats(&self) -> CacheStats {
        match self {
            CacheUnderTest::One(c) => c.stats(),
            CacheUnderTest::Sharded(c) => c.stats(),
        }
    }

    fn insert(&mut self, id: u64, v: &[f32]) -> Result<()> {
        match self {
            CacheUnderTest::One(c) => c.insert(id, v).map(|_| ()),
            CacheUnderTest::Sharded(c) => c.insert(id, v),
        }
    }

    fn set_threshold_scale(&self, scale: f32) {
        match self {
            CacheUnderTest::One(c) => c.reader().set_threshold_scale(scale),
            CacheUnderTest::Sharded(c) => c.set_threshold_scale(scale),
        }
    }
}

/// A run's floor: the estimator and controller, and the sampling of shadow checks.
struct FloorRun {
    floor: RecallFloor,
    rng: StdRng,
}

fn ids(c: &[shards::Candidate]) -> Vec<u64> {
    c.iter().map(|c| c.id).collect()
}

/// Replays `workload` through `spec`'s cache in front of `backend`, scoring request
/// `i` against `truth[workload.requests[i]]` (the exact top-k ids of its vector).
/// `routing`: the collection sample the sharded path trains its centroids on (for an
/// akerd row, `AkerdSetup::sample_rows` of them).
/// `progress` is called with the number of requests done since its last call.
pub fn run(
    spec: &RunSpec,
    workload: &Workload,
    truth: &[Vec<u64>],
    routing: &[f32],
    backend: &dyn Backend,
    progress: &dyn Fn(u64),
) -> Result<RunResult> {
    const TICK: usize = 2048;
    let start = Instant::now();
    let mut out = RunResult::default();
    let mut cache = match spec.policy.rule {
        Rule::NoCache => None,
        _ => {
            let cfg = spec.cache_config(workload.dim, backend.metric())?;
            let policy_config = spec.policy_config()?;
            // Every row's policy, akerd's included, learns once per verification.
            let policy = || -> Box<dyn HitPolicy> {
                Box::new(OncePerVerification::new(policy_config.build()))
            };
            Some(if spec.policy.rule == Rule::Akerd {
                // akerd always runs the sharded path (one shard too), with its sharding.
                let sharding = &spec.akerd()?.sharding;
                CacheUnderTest::Sharded(ShardedCache::with_policies(
                    cfg, &policy, sharding, routing,
                )?)
            } else if spec.shards <= 1 {
                CacheUnderTest::One(Cache::new(cfg, policy())?)
            } else {
                let sharding = ShardingConfig {
                    shards: spec.shards,
                    ..ShardingConfig::default()
                };
                CacheUnderTest::Sharded(ShardedCache::with_policies(
                    cfg, &policy, &sharding, routing,
                )?)
            })
        }
    };
    let mut floor = match &spec.floor {
        Some(f) if cache.is_some() => Some(FloorRun {
            floor: RecallFloor::new(f.config.clone()).map_err(Error::Config)?,
            rng: StdRng::seed_from_u64(f.seed),
        }),
        _ => None,
    };
    let mut relative_sum = 0.0;
    let mut window = WindowPoint {
        relative_sum: spec.relative.then_some(0.0),
        ..WindowPoint::default()
    };
    for (i, &r) in workload.requests.iter().enumerate() {
        let q = workload.vector(r);
        let want = &truth[r as usize];
        let (recall, relative, hit) = match cache.as_mut() {
            None => {
                let got = backend.search(q, spec.k)?;
                let recall = recall_at(got.iter().map(|c| c.id), want);
                out.miss.add(recall);
                (recall, 1.0, false)
            }
            Some(cache) => {
                let outcome = cache.search(backend, q, spec.k)?;
                let served: Vec<u64> = outcome.results.iter().map(|n| n.id).collect();
                let recall = recall_at(served.iter().copied(), want);
                match outcome.kind {
                    HitKind::Exact => out.exact.add(recall),
                    HitKind::Alias => out.alias.add(recall),
                    HitKind::Approximate => out.approximate.add(recall),
                    HitKind::Miss => out.miss.add(recall),
                }
                // The backend's answer to this request, searched once for whoever needs it.
                let mut reference: Option<Vec<u64>> = None;
                if spec.relative {
                    reference = Some(ids(&backend.search(q, spec.k)?));
                }
                if let Some(f) = floor.as_mut() {
                    f.floor.observe_served(ServedTotals {
                        exact: out.exact.count,
                        alias: out.alias.count,
                        approximate: out.approximate.count,
                        miss: out.miss.count,
                    });
                    let p = f.floor.config().sample_fraction(outcome.kind);
                    if p > 0.0 && f.rng.gen_bool(p.min(1.0)) {
                        out.shadow_calls += 1;
                        window.shadow_calls += 1;
                        let want = match &reference {
                            Some(r) => r.clone(),
                            None => ids(&backend.search(q, spec.k)?),
                        };
                        f.floor
                            .record(outcome.kind, recall_at_k(&served, &want, spec.k));
                        if let Some(scale) = f.floor.control() {
                            cache.set_threshold_scale(scale);
                        }
                    }
                }
                let relative = reference.map_or(f64::NAN, |r| recall_at_k(&served, &r, spec.k));
                (recall, relative, outcome.kind != HitKind::Miss)
            }
        };
        if spec.relative {
            relative_sum += relative;
        }
        if spec.window > 0 {
            window.requests += 1;
            window.recall_sum += recall;
            if let Some(s) = window.relative_sum.as_mut() {
                *s += relative;
            }
            window.hits += u64::from(hit);
            let last = i + 1 == workload.requests.len();
            if (i + 1) % spec.window == 0 || last {
                window.end = (i + 1) as u64;
                if let Some(f) = &floor {
                    let e = f.floor.estimate();
                    window.estimate = Some((e.recall, e.low, e.high));
                    window.scale = e.scale;
                    window.state = Some(e.state.name());
                } else {
                    window.scale = 1.0;
                }
                out.series.push(window);
                window = WindowPoint {
                    relative_sum: spec.relative.then_some(0.0),
                    ..WindowPoint::default()
                };
            }
        }
        if (i + 1) % TICK == 0 {
            progress(TICK as u64);
        }
    }
    if spec.relative {
        out.relative_sum = Some(relative_sum);
    }
    if let (Some(f), Some(spec_floor)) = (&floor, &spec.floor) {
        out.floor = Some(FloorOutcome {
            config_floor: spec_floor.config.floor,
            sample: spec_floor.config.sample,
            estimate: f.floor.estimate(),
        });
    }
    progress((workload.requests.len() % TICK) as u64);
    out.requests = workload.requests.len() as u64;
    if let Some(cache) = &cache {
        let s = cache.stats();
        // The engine's own counters must tell the same story as the outcomes.
        debug_assert_eq!(
            (s.exact_hits, s.alias_hits, s.approximate_hits, s.misses),
            (
                out.exact.count,
                out.alias.count,
                out.approximate.count,
                out.miss.count
            )
        );
        out.verifications = s.verifications;
        out.representatives = s.representatives;
        out.aliases = s.aliases;
        out.objects = s.objects;
        out.bytes = s.bytes;
        out.evictions = s.evictions;
    }
    out.seconds = start.elapsed().as_secs_f64();
    if let Some(cache) = cache.as_mut() {
        out.inserts = Some(insert_probe(cache, workload, routing)?);
    }
    Ok(out)
}

/// `INSERT_PROBE` inserts near the trace's queries, then as many copies of collection
/// rows, each timed alone (ids above any collection's).
fn insert_probe(
    cache: &mut CacheUnderTest,
    workload: &Workload,
    routing: &[f32],
) -> Result<InsertProbe> {
    let dim = workload.dim;
    let mut rng = StdRng::seed_from_u64(25);
    let mut next_id = 1u64 << 62;
    let mut time = |cache: &mut CacheUnderTest, v: &[f32]| -> Result<(f64, u64)> {
        next_id += 1;
        let before = cache.stats().fast_path_updates;
        let t = Instant::now();
        cache.insert(next_id, v)?;
        let us = t.elapsed().as_secs_f64() * 1e6;
        Ok((us, cache.stats().fast_path_updates - before))
    };
    let offset = 1e-3 / (dim as f32).sqrt();
    let mut near = Vec::with_capacity(INSERT_PROBE);
    for _ in 0..INSERT_PROBE {
        let r = workload.requests[rng.gen_range(0..workload.requests.len())];
        let v: Vec<f32> = workload
            .vector(r)
            .iter()
            .map(|x| x + if rng.gen_bool(0.5) { offset } else { -offset })
            .collect();
        near.push(time(cache, &v)?);
    }
    let rows_n = routing.len() / dim.max(1);
    let mut rows = Vec::with_capacity(INSERT_PROBE);
    for _ in 0..INSERT_PROBE.min(rows_n * 4) {
        let i = rng.gen_range(0..rows_n);
        rows.push(time(cache, &routing[i * dim..(i + 1) * dim])?);
    }
    Ok(InsertProbe {
        near: insert_cost(near),
        rows: insert_cost(rows),
    })
}

fn insert_cost(mut timed: Vec<(f64, u64)>) -> InsertCost {
    if timed.is_empty() {
        return InsertCost::default();
    }
    let n = timed.len();
    let takers_mean = timed.iter().map(|t| t.1 as f64).sum::<f64>() / n as f64;
    timed.sort_by(|a, b| a.0.total_cmp(&b.0));
    let at = |p: f64| timed[((n as f64 * p) as usize).min(n - 1)].0;
    InsertCost {
        inserts: n,
        us_p50: at(0.5),
        us_p99: at(0.99),
        takers_mean,
    }
}

/// ef values the HNSW backend's sweep tries, smallest first.
pub const EF_LADDER: [usize; 22] = [
    10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128, 160, 192, 256, 384, 512, 768, 1024,
];

/// Pairs sampled for Proximity+'s threshold, and the percentile taken.
pub const THRESHOLD_PAIRS: usize = 2_000_000;
pub const THRESHOLD_PERCENTILE: f64 = 0.01;

/// The `percentile` (in `0..=1`) of gaps (`shards::gap`) between `pairs` random pairs of distinct
/// vectors of `workload` (Proximity+'s threshold: the 1st percentile, §5 "Baselines").
/// Deterministic in `seed`.
pub fn inter_query_percentile(
    workload: &Workload,
    metric: Metric,
    pairs: usize,
    percentile: f64,
    seed: u64,
) -> f32 {
    let n = workload.n_vectors();
    assert!(n >= 2 && pairs > 0, "need two vectors and one pair");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut d: Vec<f32> = (0..pairs)
        .map(|_| {
            let a = rng.gen_range(0..n);
            // Uniform over the other n - 1 vectors.
            let b = (a + rng.gen_range(1..n)) % n;
            // In the thresholds' unit (`shards::gap`): angular on ip.
            Gauge(metric).gap_between(workload.vector(a as u32), workload.vector(b as u32))
        })
        .collect();
    let at = ((pairs - 1) as f64 * percentile.clamp(0.0, 1.0)).round() as usize;
    *d.select_nth_unstable_by(at, f32::total_cmp).1
}

/// One step of an `ef` sweep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EfPoint {
    pub ef: usize,
    pub recall: f64,
}

/// Raises `store.ef_search` along `ladder` until the mean recall@k over `samples`
/// (vector, exact top-k ids) reaches `target`; leaves the store at the chosen `ef` (the
/// last rung if none reaches it) and returns the points tried.
pub fn tune_ef(
    store: &mut HnswStore,
    samples: &[(&[f32], &[u64])],
    k: usize,
    target: f64,
    ladder: &[usize],
) -> Result<Vec<EfPoint>> {
    let mut tried = Vec::new();
    for &ef in ladder {
        store.ef_search = ef;
        let mut sum = 0.0;
        for (q, want) in samples {
            let got = store.search(q, k)?;
            sum += recall_at(got.iter().map(|c| c.id), want);
        }
        let recall = sum / samples.len() as f64;
        tried.push(EfPoint { ef, recall });
        if recall >= target {
            break;
        }
    }
    Ok(tried)
}

/// How often an HNSW query filter with these parameters returns the true nearest
/// representative first: `n` distinct vectors of `workload` are inserted as
/// representatives, the next `n` are looked up (fewer when the stream has fewer), and
/// the filter's first answer is compared with a brute-force scan. A brute-force filter
/// scores 1 by construction; approximate hits depend on finding the nearest entry.
pub fn filter_nearest_share(
    workload: &Workload,
    metric: Metric,
    kind: FilterKind,
    n: usize,
) -> (usize, f64) {
    let n = n.min(workload.n_vectors() / 2);
    let dim = workload.vector(0).len();
    let index = shards::filter::new_index(kind, metric, dim, n);
    for i in 0..n {
        index.insert(i as u64, workload.vector(i as u32));
    }
    let found = (n..2 * n)
        .filter(|&j| {
            let q = workload.vector(j as u32);
            let nearest = (0..n)
                .map(|i| (metric.distance(q, workload.vector(i as u32)), i as u64))
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
                .map(|(_, i)| i);
            index
                .search(q, FilterQuery::nearest(1, &|_| true))
                .first()
                .map(|&(r, _)| r)
                == nearest
        })
        .count();
    (n, found as f64 / n.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_round_trip() {
        for name in [
            "aker",
            "aker-bf",
            "prx",
            "prx-bf",
            "pl10",
            "pl25-bf",
            "none",
            "aker:div=16:at=0.5",
            "guarded:div=8:at=0.25-bf",
            "guarded:div=4:at=0.25:clock",
        ] {
            let p: Policy = name.parse().unwrap();
            assert_eq!(p.to_string(), name);
        }
        assert_eq!(
            "PL25".parse::<Policy>().unwrap().rule,
            Rule::Potluck { p: 0.25 }
        );
        assert!("none-bf".parse::<Policy>().is_err());
        assert_eq!("akerd".parse::<Policy>().unwrap().rule, Rule::Akerd);
        assert_eq!("akerd".parse::<Policy>().unwrap().to_string(), "akerd");
        assert!("akerd-bf".parse::<Policy>().is_err());
        assert!("pl0".parse::<Policy>().is_err());
        let g = "guarded".parse::<Policy>().unwrap();
        assert_eq!(g.to_string(), "guarded:div=4:at=0.25");
        assert!("aker:div=0.5".parse::<Policy>().is_err(), "τ₀ above minD");
        assert!("aker:at=2".parse::<Policy>().is_err(), "α_T that loosens");
        assert!("aker:tau=3".parse::<Policy>().is_err());
        assert!("lru".parse::<Policy>().is_err());
    }

    fn spec(policy: &str, pool: Capacity, akerd: Option<AkerdSetup>) -> RunSpec {
        RunSpec {
            policy: policy.parse().unwrap(),
            pool,
            k: 10,
            delta: 0,
            global_threshold: 0.5,
            potluck_grow: POTLUCK_GROW,
            potluck_shrink: POTLUCK_SHRINK,
            potluck_seed: 1,
            filter_candidates: 1,
            standby_search: StandbySearch::Nearest,
            shards: 1,
            akerd,
            floor: None,
            relative: false,
            window: 0,
        }
    }

    #[test]
    fn an_akerd_row_runs_the_file_s_engine_config_but_for_the_capacity() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/akerd.toml");
        let file = crate::akerd::AkerdFile::load(&path, Metric::L2Sq).unwrap();
        let dim = 16;
        let s = spec(
            "akerd",
            Capacity::Objects(1234),
            Some(file.setup(dim).unwrap()),
        );
        let got = s.cache_config(dim, Metric::L2Sq).unwrap();
        let want = aker_config::Config::load(&path)
            .unwrap()
            .cache
            .engine_config(dim)
            .unwrap();
        assert_ne!(
            want.capacity,
            Capacity::Objects(1234),
            "the file's is bytes"
        );
        assert_eq!(
            got,
            CacheConfig {
                capacity: Capacity::Objects(1234),
                ..want.clone()
            }
        );
        // The akerd config's settings, not the paper's the spec also carries.
        assert_eq!((got.delta, got.filter_candidates), (2, 2));
        assert!(!got.store_vectors);
        assert_eq!(got.eviction, shards::Eviction::SecondChance);
        assert_eq!(got.standby_search, StandbySearch::Learned);
        assert_eq!(s.filter_used(), Some(want.filter));
        assert_eq!(s.global_threshold_used(), None);
        // `--pools config`: the file's own capacity as well.
        let own = spec("akerd", want.capacity, s.akerd.clone());
        assert_eq!(own.cache_config(dim, Metric::L2Sq).unwrap(), want);
        // A backend of another dimension or metric is refused, not silently run.
        assert!(s.cache_config(dim + 1, Metric::L2Sq).is_err());
        assert!(s.cache_config(dim, Metric::Cosine).is_err());
        assert!(spec("akerd", Capacity::Objects(10), None)
            .cache_config(dim, Metric::L2Sq)
            .is_err());
    }

    #[test]
    fn the_paper_configuration_is_unchanged() {
        let s = spec("aker", Capacity::Objects(500), None);
        let c = s.cache_config(8, Metric::L2Sq).unwrap();
        assert_eq!(
            c,
            CacheConfig {
                delta: 0,
                capacity: Capacity::Objects(500),
                filter: FilterKind::default(),
                filter_candidates: 1,
                standby_search: StandbySearch::Nearest,
                k_max: 100,
                store_vectors: false,
                ..CacheConfig::new(8, Metric::L2Sq)
            }
        );
        assert_eq!(
            spec("prx", Capacity::Objects(500), None).global_threshold_used(),
            Some(0.5)
        );
        assert_eq!(spec("none", Capacity::Objects(1), None).filter_used(), None);
    }

    /// Records what reaches it.
    #[derive(Default)]
    struct Recorder {
        verifications: std::sync::Mutex<Vec<bool>>,
        sample: std::sync::atomic::AtomicBool,
    }

    /// The policy handed to the wrapper; the test keeps another handle to the recorder.
    struct Shared(std::sync::Arc<Recorder>);

    impl HitPolicy for Shared {
        fn name(&self) -> &'static str {
            "recorder"
        }
        fn initial_tau(&self, min_gap: f32, _kth: Option<(usize, f32)>) -> f32 {
            min_gap
        }
        fn threshold(&self, _rep: &RepView) -> f32 {
            0.0
        }
        fn on_equality_hit(&self, _rep: &RepView) {}
        fn on_approximate_hit(&self, _rep: &RepView) {}
        fn links_aliases(&self) -> bool {
            false
        }
        fn sample_verification(&self) -> bool {
            self.0.sample.load(Ordering::Relaxed)
        }
        fn on_verification(&self, cached: &[u64], fresh: &[u64]) {
            self.0.verifications.lock().unwrap().push(cached == fresh);
        }
    }

    #[test]
    fn the_wrapper_forwards_every_flag_of_the_policy() {
        let guarded = PolicyConfig::Guarded {
            alpha_l: 1.1,
            alpha_t: 0.25,
            tau_init_divisor: 8.0,
            spread: 2.0,
        };
        for config in [
            PolicyConfig::default(),
            PolicyConfig::aker_rerank(),
            guarded,
        ] {
            let (inner, wrapped) = (config.build(), OncePerVerification::new(config.build()));
            assert_eq!(
                wrapped.promotes_aliases(),
                inner.promotes_aliases(),
                "{config:?}"
            );
            assert_eq!(wrapped.rerank(), inner.rerank(), "{config:?}");
            assert_eq!(wrapped.links_aliases(), inner.links_aliases(), "{config:?}");
            let (a, b) = (
                wrapped.initial_tau(1.0, Some((10, 2.0))),
                inner.initial_tau(1.0, Some((10, 2.0))),
            );
            assert_eq!(a, b, "{config:?}");
        }
    }

    #[test]
    fn one_outcome_per_sampled_verification() {
        let rec = std::sync::Arc::new(Recorder::default());
        let p = OncePerVerification::new(Box::new(Shared(rec.clone())));
        // Reported twice (the engine's double report), learned once.
        rec.sample.store(true, Ordering::Relaxed);
        assert!(p.sample_verification());
        p.on_verification(&[1], &[1]);
        p.on_verification(&[1], &[1]);
        // Two sampled, each reported once: both learned.
        assert!(p.sample_verification());
        assert!(p.sample_verification());
        p.on_verification(&[1], &[2]);
        p.on_verification(&[3], &[3]);
        // Not sampled: nothing to learn.
        rec.sample.store(false, Ordering::Relaxed);
        assert!(!p.sample_verification());
        p.on_verification(&[1], &[1]);
        assert_eq!(*rec.verifications.lock().unwrap(), vec![true, false, true]);
    }

    #[test]
    fn recall_counts_the_overlap() {
        assert_eq!(recall_at([1, 2, 3, 9], &[1, 2, 3, 4]), 0.75);
        assert_eq!(recall_at([], &[1]), 0.0);
        assert_eq!(recall_at([5], &[]), 1.0);
    }

    #[test]
    fn a_well_built_filter_finds_the_nearest_entry() {
        let w = Workload {
            dim: 2,
            vectors: (0..400)
                .flat_map(|i| [(i % 20) as f32, (i / 20) as f32 + 0.001 * i as f32])
                .collect(),
            requests: vec![0],
            members: (0..400).collect(),
        };
        for kind in [
            FilterKind::Hnsw {
                m: 16,
                ef_construction: 100,
                ef_search: 64,
            },
            FilterKind::HnswRs {
                m: 16,
                ef_construction: 100,
                ef_search: 64,
            },
        ] {
            let (n, share) = filter_nearest_share(&w, Metric::L2Sq, kind, 1_000);
            assert_eq!(n, 200);
            assert!(share > 0.95, "{kind}: {share}");
        }
    }

    #[test]
    fn percentile_of_a_known_spread() {
        // Vectors 0, 1, ..., 99 on a line: pair distances are squared index gaps.
        let w = Workload {
            dim: 1,
            vectors: (0..100).map(|i| i as f32).collect(),
            requests: vec![0],
            members: (0..100).collect(),
        };
        let p1 = inter_query_percentile(&w, Metric::L2Sq, 200_000, 0.01, 1);
        // P(|i - j| <= 1) over distinct pairs is 2 * 99 / 9900 = 2%.
        assert_eq!(p1, 1.0);
        assert_eq!(
            p1,
            inter_query_percentile(&w, Metric::L2Sq, 200_000, 0.01, 1)
        );
        let median = inter_query_percentile(&w, Metric::L2Sq, 200_000, 0.5, 1);
        assert!((700.0..1000.0).contains(&median), "{median}");
        assert_eq!(inter_query_percentile(&w, Metric::L2Sq, 1000, 0.0, 2), 1.0);
    }
}
