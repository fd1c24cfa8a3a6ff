//! The cache under updates (paper §5.4: Figure 18, Table 3, Figure 19): warm the cache
//! on a simZipf stream, insert vectors held out of the collection, delete a share of the
//! collection at random, replay the same stream, and score every reply against the
//! exact neighbours of the collection as it is **then**.
//!
//! ```text
//!  all rows ─► bases (--queries or held out) ─► simZipf groups ─► one stream
//!          └─► insert set (held out) ┐
//!          └─► collection ───────────┴─► union: ids 0..n collection, n.. inserts
//!  per distinct vector of the stream: exact top-DEPTH over the union (once, cached)
//!  a run:  warm (live = collection) ─► inserts (timed) ─► deletes (timed) ─► replay
//!  a backend's answer = the first n live ids of its top-DEPTH over the union,
//!                       searched deeper when fewer survive (`LiveBackend`)
//! ```
//!
//! Every reply of every run is checked against the ids not live at that moment (deleted,
//! or not inserted yet): `RunResult::dead_served` must be zero.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use aker_formats::data::{self, Dataset};
use aker_formats::trace::{Op, Trace};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use shards::store::HnswStore;
use shards::{
    Admission, Backend, Cache, CacheConfig, Candidate, Capacity, Error, HitKind, HitPolicy, Metric,
    PolicyConfig, Result,
};

use crate::experiment::{
    inter_query_percentile, recall_at, OncePerVerification, POTLUCK_GROW, POTLUCK_SHRINK,
    THRESHOLD_PAIRS, THRESHOLD_PERCENTILE,
};
use crate::groundtruth;
use crate::precomputed::PrecomputedBackend;
use crate::prepare::Seeds;
use crate::workload::{self, Groups, Workload, GROUP_SIZE};

/// How deep each distinct vector's answer over the union is prepared: k + Δ = 40 at the
/// paper's largest Δ, with room for a quarter deleted and the not-yet-inserted filtered.
pub const DEPTH: usize = 80;

/// The deletion rates of the paper's Figure 18 (and 0: inserts only).
pub const RATES: [f64; 4] = [0.0, 0.05, 0.10, 0.25];

/// What a policy does on writes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UpdatePolicy {
    /// Paper-Aker with reserve Δ; `refresh: false` is the no-refresh ablation
    /// (`CacheConfig::refresh`); `risk`: τ_risk (default the engine's 0.3).
    Aker {
        delta: usize,
        refresh: bool,
        risk: Option<f64>,
    },
    /// Potluck+ with verification probability `p`, Δ = 0 and no refresh (§5.4: "For
    /// PL10 and AK-RD, no refresh is performed").
    Potluck {
        p: f64,
    },
    NoCache,
}

impl UpdatePolicy {
    pub fn delta(&self) -> usize {
        match *self {
            UpdatePolicy::Aker { delta, .. } => delta,
            _ => 0,
        }
    }

    pub fn is_cache(&self) -> bool {
        *self != UpdatePolicy::NoCache
    }
}

/// `ak-d10`, `ak-d30`, `ak-rd` (Δ 0, no refresh), `ak-d0`, `pl10`, `none`; an Aker
/// name takes `:risk=R`.
impl FromStr for UpdatePolicy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<UpdatePolicy, String> {
        let lower = s.trim().to_ascii_lowercase();
        let (name, params) = lower.split_once(':').unwrap_or((lower.as_str(), ""));
        let bad = || format!("unknown update policy '{s}' (ak-dN, ak-rd, plNN, none; ak-*:risk=R)");
        let mut policy = match name {
            "none" => UpdatePolicy::NoCache,
            "ak-rd" => UpdatePolicy::Aker {
                delta: 0,
                refresh: false,
                risk: None,
            },
            _ if name.starts_with("ak-d") => UpdatePolicy::Aker {
                delta: name["ak-d".len()..].parse().map_err(|_| bad())?,
                refresh: true,
                risk: None,
            },
            _ => match name.strip_prefix("pl").map(str::parse::<u32>) {
                Some(Ok(pct)) if (1..=100).contains(&pct) => UpdatePolicy::Potluck {
                    p: f64::from(pct) / 100.0,
                },
                _ => return Err(bad()),
            },
        };
        if let Some(r) = params.strip_prefix("risk=") {
            let r: f64 = r.parse().map_err(|e| format!("'{s}': risk: {e}"))?;
            match &mut policy {
                UpdatePolicy::Aker {
                    risk,
                    refresh: true,
                    ..
                } if r.is_finite() && r > 0.0 => *risk = Some(r),
                _ => return Err(format!("'{s}': risk=R (R > 0) is for ak-dN policies")),
            }
        } else if !params.is_empty() {
            return Err(bad());
        }
        Ok(policy)
    }
}

impl fmt::Display for UpdatePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            UpdatePolicy::NoCache => write!(f, "none"),
            UpdatePolicy::Potluck { p } => write!(f, "pl{}", (p * 100.0).round()),
            UpdatePolicy::Aker { refresh: false, .. } => write!(f, "ak-rd"),
            UpdatePolicy::Aker { delta, risk, .. } => {
                write!(f, "ak-d{delta}")?;
                match risk {
                    Some(r) => write!(f, ":risk={r}"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// Everything the runs of one data set share.
pub struct Scenario {
    pub name: String,
    pub metric: Metric,
    pub k: usize,
    /// The collection (rows `0..collection`) and after it the insert set.
    pub union: Dataset,
    pub collection: usize,
    pub workload: Workload,
    /// Per distinct vector of the stream, its exact top `DEPTH` over `union`.
    pub exact: PrecomputedBackend,
    /// Every id of the union in a random order: rate r deletes the first r · collection.
    pub delete_order: Vec<u64>,
    /// Potluck+'s starting threshold (Proximity+'s: 1st percentile of inter-query gaps).
    pub threshold: f32,
    /// The ground truth was read from the cache, not computed.
    pub truth_loaded: bool,
    pub skew: f64,
}

/// Mixed into the split seed for the insert set and the delete order (so `Seeds`,
/// printed in every report, stays as it was).
const INSERT_SPLIT: u64 = 0x001a_5e47;
const DELETE_ORDER: u64 = 0x00de_1e7e;

/// What a scenario is made of (`Scenario::prepare`).
pub struct ScenarioSpec<'a> {
    pub name: String,
    pub metric: Metric,
    pub k: usize,
    /// The simZipf group bases (held out of `rows`, or a query file's).
    pub bases: &'a Dataset,
    /// The collection and the insert set together (the bases are not in it).
    pub rows: &'a Dataset,
    /// Share of `rows` held out as the insert set (the paper: 5%).
    pub insert_share: f64,
    pub requests: usize,
    pub skew: f64,
    /// Unit-normalise the group members (`--normalize`).
    pub unit_requests: bool,
    pub seeds: Seeds,
    pub cache_dir: &'a Path,
}

impl Scenario {
    /// Splits the insert set off, builds the groups and the stream, and finds each
    /// distinct vector's exact top `DEPTH` over the union (cached on disk like every
    /// ground truth; `progress` counts vectors scanned).
    pub fn prepare(
        spec: &ScenarioSpec,
        progress: &(dyn Fn(usize) + Sync),
    ) -> std::result::Result<Scenario, String> {
        let n_insert = (spec.rows.n as f64 * spec.insert_share).round() as usize;
        if !(0.0..1.0).contains(&spec.insert_share) || spec.rows.n <= n_insert + DEPTH {
            return Err(format!(
                "{}: {} rows cannot hold out {n_insert} inserts and keep {DEPTH} neighbours",
                spec.name, spec.rows.n
            ));
        }
        let (collection, inserts) =
            data::split_queries(spec.rows, n_insert, spec.seeds.split ^ INSERT_SPLIT);
        let mut union = collection.data;
        union.extend_from_slice(&inserts.data);
        let union = Dataset::new(spec.rows.dim, union)?;
        let mut groups = Groups::build(spec.bases, spec.bases, GROUP_SIZE, spec.seeds.groups);
        if spec.unit_requests {
            groups.normalize_members();
        }
        let workload = workload::sim_zipf(&groups, spec.requests, spec.skew, spec.seeds.stream);
        let gt = groundtruth::exact_top_n_cached(
            &union,
            &workload.vectors,
            spec.metric,
            DEPTH,
            spec.cache_dir,
            progress,
        )
        .map_err(|e| format!("ground truth cache in {}: {e}", spec.cache_dir.display()))?;
        let exact =
            PrecomputedBackend::new(union.dim, spec.metric, union.n, &workload.vectors, gt.lists);
        let threshold = inter_query_percentile(
            &workload,
            spec.metric,
            THRESHOLD_PAIRS,
            THRESHOLD_PERCENTILE,
            spec.seeds.threshold,
        );
        Ok(Scenario {
            name: spec.name.clone(),
            metric: spec.metric,
            k: spec.k,
            collection: collection.n,
            delete_order: shuffled_ids(union.n, spec.seeds.split ^ DELETE_ORDER),
            union,
            workload,
            exact,
            threshold,
            truth_loaded: gt.loaded,
            skew: spec.skew,
        })
    }

    /// The ids a deletion rate deletes (a prefix of one order, so 5% ⊂ 10% ⊂ 25%).
    pub fn deletes(&self, rate: f64) -> &[u64] {
        let n = ((self.collection as f64) * rate).round() as usize;
        &self.delete_order[..n.min(self.delete_order.len())]
    }

    pub fn inserts(&self) -> std::ops::Range<u64> {
        self.collection as u64..self.union.n as u64
    }

    /// Who is live before the writes (the collection) and after them at `rate`.
    pub fn liveness(&self, rate: Option<f64>) -> Vec<bool> {
        let mut live: Vec<bool> = (0..self.union.n).map(|i| i < self.collection).collect();
        if let Some(rate) = rate {
            live.iter_mut()
                .skip(self.collection)
                .for_each(|l| *l = true);
            for &id in self.deletes(rate) {
                live[id as usize] = false;
            }
        }
        live
    }

    /// Per distinct vector, its exact top-k ids among the `live` rows.
    pub fn truth(&self, live: &[bool]) -> Result<Vec<Vec<u64>>> {
        let b = LiveBackend::new(self, &self.exact, None, live.to_vec());
        (0..self.workload.n_vectors())
            .map(|i| {
                let q = self.workload.vector(i as u32);
                Ok(b.search(q, self.k)?.iter().map(|c| c.id).collect())
            })
            .collect()
    }
}

/// A backend over the live rows of the union: the first `n` live candidates of the
/// vector's prepared top-`DEPTH` (exact, or the HNSW graph's over the whole union,
/// whose not-live points are filtered out as `HnswStore` filters its tombstones), and
/// when fewer survive a deeper search (brute force over the live rows; the graph asked
/// for more).
pub struct LiveBackend<'a> {
    sc: &'a Scenario,
    lists: &'a PrecomputedBackend,
    hnsw: Option<&'a HnswStore>,
    live: Vec<bool>,
    live_n: usize,
    /// Searches that needed more than the prepared list.
    pub deeper: AtomicU64,
}

impl<'a> LiveBackend<'a> {
    pub fn new(
        sc: &'a Scenario,
        lists: &'a PrecomputedBackend,
        hnsw: Option<&'a HnswStore>,
        live: Vec<bool>,
    ) -> LiveBackend<'a> {
        let live_n = live.iter().filter(|&&l| l).count();
        LiveBackend {
            sc,
            lists,
            hnsw,
            live,
            live_n,
            deeper: AtomicU64::new(0),
        }
    }

    pub fn set_live(&mut self, id: u64, live: bool) {
        let slot = &mut self.live[id as usize];
        if *slot != live {
            self.live_n = if live {
                self.live_n + 1
            } else {
                self.live_n - 1
            };
        }
        *slot = live;
    }

    pub fn is_live(&self, id: u64) -> bool {
        self.live.get(id as usize).copied().unwrap_or(false)
    }

    fn deeper_search(&self, q: &[f32], n: usize) -> Result<Vec<Candidate>> {
        self.deeper.fetch_add(1, Ordering::Relaxed);
        if let Some(h) = self.hnsw {
            let mut out = h.search(q, (n * 4 + DEPTH).min(self.sc.union.n))?;
            out.retain(|c| self.is_live(c.id));
            out.truncate(n);
            out.iter_mut().for_each(|c| c.vector = None);
            return Ok(out);
        }
        let metric = self.sc.metric;
        let mut all: Vec<Candidate> = self
            .sc
            .union
            .rows()
            .enumerate()
            .filter(|(i, _)| self.live[*i])
            .map(|(i, row)| Candidate::new(i as u64, metric.distance(q, row)))
            .collect();
        let n = n.min(all.len());
        if n < all.len() {
            all.select_nth_unstable_by(n, |a, b| {
                a.distance.total_cmp(&b.distance).then(a.id.cmp(&b.id))
            });
            all.truncate(n);
        }
        shards::backend::sort_candidates(&mut all);
        Ok(all)
    }
}

impl Backend for LiveBackend<'_> {
    fn dim(&self) -> usize {
        self.sc.union.dim
    }
    fn metric(&self) -> Metric {
        self.sc.metric
    }
    fn search(&self, q: &[f32], n: usize) -> Result<Vec<Candidate>> {
        let list = self
            .lists
            .list(q)
            .ok_or_else(|| Error::Backend("a vector the stream does not hold".into()))?;
        let out: Vec<Candidate> = list
            .iter()
            .filter(|c| self.is_live(c.id))
            .take(n)
            .cloned()
            .collect();
        if out.len() < n && out.len() < self.live_n && list.len() >= DEPTH {
            return self.deeper_search(q, n);
        }
        Ok(out)
    }
    fn insert(&mut self, _id: u64, _v: &[f32]) -> Result<()> {
        Err(Error::Backend(
            "live backend: writes go through set_live".into(),
        ))
    }
    fn delete(&mut self, _id: u64) -> Result<bool> {
        Err(Error::Backend(
            "live backend: writes go through set_live".into(),
        ))
    }
    fn len(&self) -> usize {
        self.live_n
    }
    fn contains(&self, id: u64) -> Option<bool> {
        Some(self.is_live(id))
    }
    fn name(&self) -> &'static str {
        if self.hnsw.is_some() {
            "hnsw-live"
        } else {
            "exact-live"
        }
    }
}

/// One run: a policy, a deletion rate, a pool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UpdateRun {
    pub policy: UpdatePolicy,
    pub rate: f64,
    pub pool: Capacity,
}

/// Requests of one phase by outcome, and their recall.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseTally {
    pub requests: u64,
    pub exact: u64,
    pub alias: u64,
    pub approximate: u64,
    pub misses: u64,
    pub recall_sum: f64,
    /// Replies that carried an id not live at that moment (deleted or not inserted).
    pub dead_served: u64,
}

impl PhaseTally {
    pub fn recall(&self) -> f64 {
        self.recall_sum / self.requests as f64
    }
    pub fn hits(&self) -> u64 {
        self.exact + self.alias + self.approximate
    }
    pub fn hit_ratio(&self) -> f64 {
        self.hits() as f64 / self.requests as f64
    }
}

/// Median, 99th percentile and largest of one kind of write, µs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CostUs {
    pub count: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl CostUs {
    fn of(mut ns: Vec<u64>) -> CostUs {
        if ns.is_empty() {
            return CostUs::default();
        }
        ns.sort_unstable();
        let at = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
        CostUs {
            count: ns.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: *ns.last().expect("not empty") as f64 / 1e3,
        }
    }
}

/// When the cache first served each inserted vector that an exact hit of the replay
/// should have carried (it is in the exact top-k of the request, which is the entry's
/// own query).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Visibility {
    /// Inserted ids some hit should have carried, by whether the insert's fast path
    /// took them (index 1) or not (index 0).
    pub wanted: [u64; 2],
    /// ... carried by the first hit that should have.
    pub at_once: [u64; 2],
    /// ... carried later: the hits that missed it first, per id.
    pub later: [Vec<u32>; 2],
    /// ... never carried by a hit of the replay.
    pub never: [u64; 2],
}

/// What one run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunResult {
    pub warm: PhaseTally,
    pub replay: PhaseTally,
    /// The replay until it admitted as many entries as the pool held before the writes:
    /// the part served while entries that lived through the writes can still be in the
    /// pool (FIFO: a full turnover evicts the last of them). The rest of the replay is
    /// the steady state of a pool rebuilt from the backend.
    pub replay_head: PhaseTally,
    pub entries_warm: usize,
    pub bytes_warm: usize,
    /// Entries left after the inserts and deletes, before the replay.
    pub entries_after_writes: usize,
    pub entries_end: usize,
    pub insert: CostUs,
    pub delete: CostUs,
    /// Inserts the fast path put into an entry at once.
    pub fast_path_inserts: u64,
    pub slow_path_steps: u64,
    /// Deletes' effect on entries: a reserve promoted, or the entry dropped.
    pub entries_repaired: u64,
    pub entries_invalidated: u64,
    pub visibility: Visibility,
    /// Backend searches that needed more than the prepared lists.
    pub deeper_searches: u64,
    pub seconds: f64,
}

impl RunResult {
    pub fn dead_served(&self) -> u64 {
        self.warm.dead_served + self.replay.dead_served
    }
}

/// The engine configuration of `run`'s cache: the paper's (HNSW query filter m 4 /
/// efc 8 / efs 16, the closest candidate only, ids-only objects, FIFO), with its Δ,
/// refresh and τ_risk.
pub fn cache_config(run: &UpdateRun, dim: usize, metric: Metric, k: usize) -> CacheConfig {
    let (refresh, risk) = match run.policy {
        UpdatePolicy::Aker { refresh, risk, .. } => (refresh, risk),
        _ => (false, None),
    };
    let base = CacheConfig::new(dim, metric);
    CacheConfig {
        delta: run.policy.delta(),
        capacity: run.pool,
        filter_candidates: 1,
        k_max: k.max(100),
        store_vectors: false,
        refresh,
        risk_threshold: risk.unwrap_or(base.risk_threshold),
        ..base
    }
}

fn policy(run: &UpdateRun, threshold: f32, seed: u64) -> Box<dyn HitPolicy> {
    let config = match run.policy {
        UpdatePolicy::Potluck { p } => PolicyConfig::Potluck {
            threshold,
            p,
            grow: POTLUCK_GROW,
            shrink: POTLUCK_SHRINK,
            seed,
        },
        _ => PolicyConfig::default(),
    };
    Box::new(OncePerVerification::new(config.build()))
}

/// Where each wanted inserted id stands during the replay: hits that missed it so far,
/// and whether one carried it.
#[derive(Default)]
struct Seen {
    missed_by: u32,
    served: bool,
}

/// Warm, write, replay (module docs). `warm_truth` / `replay_truth`: per distinct vector,
/// its exact top-k before and after the writes. `hnsw`: the graph the backend's lists
/// came from (deeper searches), `None` for the exact backend.
#[allow(clippy::too_many_arguments)]
pub fn run(
    run: &UpdateRun,
    sc: &Scenario,
    lists: &PrecomputedBackend,
    hnsw: Option<&HnswStore>,
    warm_truth: &[Vec<u64>],
    replay_truth: &[Vec<u64>],
    seed: u64,
    progress: &dyn Fn(u64),
) -> Result<RunResult> {
    let phases = Phases {
        lists,
        hnsw,
        warm_truth,
        replay_truth,
    };
    run_with(run, sc, &phases, seed, Fault::None, progress)
}

/// What one run replays against (`run`).
pub struct Phases<'a> {
    pub lists: &'a PrecomputedBackend,
    pub hnsw: Option<&'a HnswStore>,
    pub warm_truth: &'a [Vec<u64>],
    pub replay_truth: &'a [Vec<u64>],
}

/// A defect planted on purpose, so a test can show the checks catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// The deletes reach the backend but not the cache.
    CacheMissesDeletes,
}

/// `run` with a planted `fault`.
pub fn run_with(
    run: &UpdateRun,
    sc: &Scenario,
    phases: &Phases,
    seed: u64,
    fault: Fault,
    progress: &dyn Fn(u64),
) -> Result<RunResult> {
    let Phases {
        lists,
        hnsw,
        warm_truth,
        replay_truth,
    } = *phases;
    let start = Instant::now();
    let k = sc.k;
    let mut out = RunResult::default();
    let mut backend = LiveBackend::new(sc, lists, hnsw, sc.liveness(None));
    let mut cache = match run.policy {
        UpdatePolicy::NoCache => None,
        _ => Some(Cache::new(
            cache_config(run, sc.union.dim, sc.metric, k),
            policy(run, sc.threshold, seed),
        )?),
    };
    // `live`: who is live in this phase, computed apart from the backend the run
    // updates, so a write the run forgot cannot hide from the check. `head`: the tally to
    // copy once the phase has admitted that many entries.
    let replay = |cache: &mut Option<Cache>,
                  backend: &LiveBackend,
                  truth: &[Vec<u64>],
                  live: &[bool],
                  tally: &mut PhaseTally,
                  mut head: Option<(&mut PhaseTally, usize)>,
                  mut wanted: Option<&mut HashMap<u64, Seen>>|
     -> Result<()> {
        let mut admitted = 0usize;
        for &r in &sc.workload.requests {
            let q = sc.workload.vector(r);
            let (kind, served): (HitKind, Vec<u64>) = match cache.as_mut() {
                None => (
                    HitKind::Miss,
                    backend.search(q, k)?.iter().map(|c| c.id).collect(),
                ),
                Some(c) => {
                    let o = c.search(backend, q, k)?;
                    admitted += usize::from(matches!(o.admission, Some(Admission::Admitted(_))));
                    (o.kind, o.results.iter().map(|n| n.id).collect())
                }
            };
            let want = &truth[r as usize];
            tally.requests += 1;
            tally.recall_sum += recall_at(served.iter().copied(), want);
            let dead = |id: &u64| !live.get(*id as usize).copied().unwrap_or(false);
            tally.dead_served += u64::from(served.iter().any(dead));
            match kind {
                HitKind::Exact => tally.exact += 1,
                HitKind::Alias => tally.alias += 1,
                HitKind::Approximate => tally.approximate += 1,
                HitKind::Miss => tally.misses += 1,
            }
            // Exact hits only: the request is the entry's own query, so its true top-k
            // is the entry's (an approximate hit serves another query's list).
            if let (Some(wanted), true) = (wanted.as_deref_mut(), kind == HitKind::Exact) {
                for id in want.iter().filter(|&&id| id >= sc.collection as u64) {
                    let seen = wanted.entry(*id).or_default();
                    if !seen.served {
                        if served.contains(id) {
                            seen.served = true;
                        } else {
                            seen.missed_by += 1;
                        }
                    }
                }
            }
            if let Some((h, n)) = head.as_mut() {
                if h.requests == 0 && admitted >= *n {
                    **h = *tally;
                }
            }
            if tally.requests % 4096 == 0 {
                progress(4096);
            }
        }
        progress(tally.requests % 4096);
        if let Some((h, _)) = head {
            if h.requests == 0 {
                *h = *tally;
            }
        }
        Ok(())
    };
    let warm_live = sc.liveness(None);
    replay(
        &mut cache,
        &backend,
        warm_truth,
        &warm_live,
        &mut out.warm,
        None,
        None,
    )?;
    if let Some(c) = &cache {
        out.entries_warm = c.len();
        out.bytes_warm = c.bytes();
    }
    // The writes, applied to the backend first as akerd applies them (§4.6).
    let mut fast_taken = vec![false; sc.union.n - sc.collection];
    let mut ns = Vec::with_capacity(fast_taken.len());
    for id in sc.inserts() {
        backend.set_live(id, true);
        if let Some(c) = cache.as_mut() {
            let v = sc.union.row(id as usize);
            let t = Instant::now();
            let o = c.insert(id, v)?;
            ns.push(t.elapsed().as_nanos() as u64);
            fast_taken[id as usize - sc.collection] = o.fast_path;
            out.fast_path_inserts += u64::from(o.fast_path);
            out.slow_path_steps += o.slow_path_steps as u64;
        }
    }
    out.insert = CostUs::of(ns);
    let deletes = sc.deletes(run.rate);
    let mut ns = Vec::with_capacity(deletes.len());
    for &id in deletes {
        backend.set_live(id, false);
        if fault == Fault::CacheMissesDeletes {
            continue;
        }
        if let Some(c) = cache.as_mut() {
            let t = Instant::now();
            let d = c.delete(id);
            ns.push(t.elapsed().as_nanos() as u64);
            out.entries_repaired += d.repaired as u64;
            out.entries_invalidated += d.invalidated as u64;
        }
    }
    out.delete = CostUs::of(ns);
    out.entries_after_writes = cache.as_ref().map_or(0, Cache::len);
    let mut wanted = HashMap::new();
    let replay_live = sc.liveness(Some(run.rate));
    replay(
        &mut cache,
        &backend,
        replay_truth,
        &replay_live,
        &mut out.replay,
        Some((&mut out.replay_head, out.entries_warm)),
        Some(&mut wanted),
    )?;
    out.entries_end = cache.as_ref().map_or(0, Cache::len);
    for (id, seen) in wanted {
        let fast = usize::from(fast_taken[id as usize - sc.collection]);
        let v = &mut out.visibility;
        v.wanted[fast] += 1;
        match (seen.served, seen.missed_by) {
            (true, 0) => v.at_once[fast] += 1,
            (true, n) => v.later[fast].push(n),
            (false, _) => v.never[fast] += 1,
        }
    }
    out.visibility
        .later
        .iter_mut()
        .for_each(|l| l.sort_unstable());
    out.deeper_searches = backend.deeper.load(Ordering::Relaxed);
    out.seconds = start.elapsed().as_secs_f64();
    Ok(out)
}

/// The traces of one end-to-end run through akerd at one write share: the stream as
/// a warm-up (ground truth: the collection), the stream again with writes mixed in (no
/// ground truth: the collection changes under it), and the stream once more (ground
/// truth: the collection after those writes), so that recall is measured in read-only
/// phases between the writes.
pub struct TraceSet {
    pub warm: Trace,
    pub writes: Trace,
    pub replay: Trace,
    pub inserts: usize,
    pub deletes: usize,
}

impl Scenario {
    /// [`TraceSet`] with writes `share` of the middle phase's operations: after every
    /// few searches one write, alternately an insert (the insert set in order, ids
    /// `collection..`) and a delete (collection ids in `delete_order`), evenly spread.
    pub fn traces(&self, share: f64) -> Result<TraceSet> {
        let w = &self.workload;
        let (dim, k) = (self.union.dim, self.k as u32);
        let searches = w.requests.len();
        let writes = ((searches as f64) * share / (1.0 - share)).round() as usize;
        let n_ins = writes.div_ceil(2).min(self.union.n - self.collection);
        let deleted: Vec<u64> = self
            .delete_order
            .iter()
            .copied()
            .filter(|&id| id < self.collection as u64)
            .take(writes - n_ins)
            .collect();
        let mut vectors = w.vectors.clone();
        for id in self.inserts().take(n_ins) {
            vectors.extend_from_slice(self.union.row(id as usize));
        }
        let mut ops = Vec::with_capacity(searches + writes);
        let (mut ins, mut del) = (0usize, 0usize);
        for (i, &vector) in w.requests.iter().enumerate() {
            ops.push(Op::Search { vector, k });
            // Writes due by the end of search i, spread evenly over the phase.
            let due = (i + 1) * (n_ins + deleted.len()) / searches;
            while ins + del < due {
                if (ins <= del && ins < n_ins) || del == deleted.len() {
                    let id = self.collection as u64 + ins as u64;
                    let vector = (w.n_vectors() + ins) as u32;
                    ops.push(Op::Insert { id, vector });
                    ins += 1;
                } else {
                    ops.push(Op::Delete { id: deleted[del] });
                    del += 1;
                }
            }
        }
        let mut live = self.liveness(None);
        let searches_of = |live: &[bool]| -> Result<Trace> {
            let mut t = Trace::searches(dim, self.metric, k, w.vectors.clone(), &w.requests);
            t.ground_truth = Some(self.truth(live)?);
            Ok(t)
        };
        let warm = searches_of(&live)?;
        for id in self.inserts().take(n_ins) {
            live[id as usize] = true;
        }
        for &id in &deleted {
            live[id as usize] = false;
        }
        let replay = searches_of(&live)?;
        let writes = Trace {
            dim,
            metric: self.metric,
            k,
            vectors,
            ops,
            ground_truth: None,
        };
        writes
            .validate()
            .map_err(|e| Error::Config(format!("writes trace: {e}")))?;
        Ok(TraceSet {
            warm,
            writes,
            replay,
            inserts: n_ins,
            deletes: deleted.len(),
        })
    }
}

/// A random order of `n` ids (`Scenario::delete_order`).
pub fn shuffled_ids(n: usize, seed: u64) -> Vec<u64> {
    let mut ids: Vec<u64> = (0..n as u64).collect();
    ids.shuffle(&mut StdRng::seed_from_u64(seed));
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_name_themselves() {
        for name in [
            "ak-d10",
            "ak-d30",
            "ak-rd",
            "ak-d0",
            "pl10",
            "none",
            "ak-d10:risk=1",
        ] {
            let p: UpdatePolicy = name.parse().unwrap();
            assert_eq!(p.to_string(), name);
        }
        assert_eq!(
            "ak-rd".parse::<UpdatePolicy>().unwrap(),
            UpdatePolicy::Aker {
                delta: 0,
                refresh: false,
                risk: None
            }
        );
        for bad in [
            "ak",
            "ak-dx",
            "pl0",
            "pl10:risk=1",
            "ak-d10:risk=0",
            "ak-d10:x=1",
        ] {
            assert!(bad.parse::<UpdatePolicy>().is_err(), "{bad}");
        }
    }

    #[test]
    fn costs_are_percentiles_in_microseconds() {
        let c = CostUs::of((1..=100).map(|i| i * 1_000).collect());
        assert_eq!((c.count, c.p50, c.p99, c.max), (100, 51.0, 99.0, 100.0));
        assert_eq!(CostUs::of(Vec::new()), CostUs::default());
    }
}
