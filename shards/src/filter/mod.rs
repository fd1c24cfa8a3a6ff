//! The dual query filter (§4.7): an ANN index over representative queries, in two
//! generations so that evictions never need per-entry deletes from the graph.
//!
//! ```text
//!   admit ──► active (F_A) ── inserts only
//!   evict ──► whichever generation holds the entry: tombstone (readers skip it: the
//!             entry is gone from the published representatives)
//!   standby has no live entry and active more tombstones than live,
//!   or tombstones > 3 x live overall ──► rotate:
//!                                  new active = empty
//!                                  standby   = old active (sealed)
//!                                  draining  = old standby, while it has live entries
//!   each filter write (insert, tombstone) and idle owner time ──► migrate: re-insert
//!             one live entry of the draining generation into the active one (never
//!             lost); once none is left the draining generation is unpublished
//!   every generation unpublished ──► freed by the owner once no retired FilterSet
//!             holds it (DualFilter::reclaim: never inside a reader's lookup)
//!   standby without live entries (FIFO evicted them all) ──► dropped at once
//!   idle owner time, nothing draining ──► move the standby's live entries into the
//!             active one (newest first), so that it empties sooner
//!   lookup ──► search every generation of the published FilterSet, nearest first;
//!             the standby only for what is nearer than the active one's answer, or
//!             (StandbySearch::ActiveFirst) only when the active one has no candidate
//!             that serves, or (StandbySearch::Learned, akerd's default) as ActiveFirst
//!             with the two in the order hits have been coming from (GenerationOrder);
//!             each search ends early once it has found a candidate that serves
//!             (FilterIndex::search, FilterQuery::serves)
//! ```
//!
//! Two generations are searched from a rotation until the standby is empty: under FIFO
//! that is one cache's worth of admissions (of every two between rotations), and at
//! d = 768 it nearly doubles an approximate hit's cost (`bench/benches/engine.rs`).
//! A dead standby is therefore dropped at once, and a server's idle owner time
//! (`Cache::maintain`) moves the standby's entries over, so that under moderate load
//! the two-generation phase lasts as long as re-inserting one cache takes (about 25 µs
//! per entry at d = 768) rather than until FIFO has evicted them all.
//!
//! ALGORITHM.md's rule is "when tombstones outnumber live entries"; counted over both
//! generations it fires again right after a rotation (the sealed generation keeps its
//! tombstones), so every rotation came in pairs and the second dropped a generation
//! still half alive: at 100,000 entries, 100,000 survivors to re-insert at once. Counted
//! per generation (`DualFilter::rotation_due`), FIFO eviction makes rotations free.
//!
//! Migration is incremental because re-inserting every survivor at once stalled the
//! owner: 0.45 s for 50,000 survivors at d = 768 inside one delete. Survivors are searched
//! in the draining generation without a bound until they move. A rotation that finds the
//! previous draining unfinished completes it first.
//!
//! [`DualFilter`] is the owner's bookkeeping; readers see only the [`FilterSet`] it
//! publishes through an `EpochCell`.

mod brute;
mod graph;
mod hnsw;

pub use brute::BruteForceIndex;
pub use graph::GraphIndex;
pub use hnsw::{HnswIndex, SimdDistance};

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use crate::config::{FilterKind, StandbySearch};
use crate::entry::RepId;
use crate::epoch::EpochCell;
use crate::hash::HashMap;
use crate::metric::Metric;

/// One generation's index. Inserts take `&self` so readers can search while the owner
/// inserts (hnsw_rs's own short locks are accepted). Tombstones are not the index's
/// business: searches take a predicate and return only accepted ids.
pub trait FilterIndex: Send + Sync {
    fn insert(&self, rep: RepId, v: &[f32]);
    /// Up to `want.n` accepted reps near `q`, nearest first, as [`FilterQuery`] asks.
    /// The distances may be approximate (the graph's are over int8 codes): callers
    /// recompute exact ones.
    fn search(&self, q: &[f32], want: FilterQuery<'_>) -> Vec<(RepId, f32)>;
    /// As `insert`, starting from what a search of the same vector in this index left
    /// in `seeds` (seeds of another index are ignored). The default inserts as `insert`.
    fn insert_seeded(&self, rep: RepId, v: &[f32], seeds: &InsertSeeds) {
        let _ = seeds;
        self.insert(rep, v);
    }
    /// Points inserted, tombstoned ones included.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a [`FilterIndex::search`] is asked for. Only `n` and `accept` bind every index;
/// the rest are permissions an index may use to stop early (the graph does; brute force
/// and hnsw_rs ignore them).
pub struct FilterQuery<'a> {
    /// Most candidates returned.
    pub n: usize,
    /// Only accepted reps are returned (tombstones are the caller's business).
    pub accept: &'a dyn Fn(RepId) -> bool,
    /// Candidates whose (index-own) distance exceeds it may be left out, and the search
    /// may stop early because of it (`f32::INFINITY`: no bound).
    pub bound: f32,
    /// For a caller that wants the nearest candidate that serves (`serves(r)`: its exact
    /// distance when `r` would answer): the index may offer candidates while it searches
    /// and stop once nothing nearer than a serving one can turn up. Whatever it offered
    /// may be offered again by the caller.
    pub serves: Option<&'a mut dyn FnMut(RepId) -> Option<f32>>,
    /// A search that found nothing serving and ran to its end may leave here what an
    /// insertion of `q` into this index would search for (`insert_seeded`).
    pub seeds: Option<&'a mut InsertSeeds>,
}

impl<'a> FilterQuery<'a> {
    /// The `n` nearest accepted reps, no bound, nothing offered or left.
    pub fn nearest(n: usize, accept: &'a dyn Fn(RepId) -> bool) -> FilterQuery<'a> {
        FilterQuery {
            n,
            accept,
            bound: f32::INFINITY,
            serves: None,
            seeds: None,
        }
    }
}

/// What a miss's lookup found in the active generation, handed to the owner with its
/// ticket so that the admission links the new node without searching the graph again:
/// the nodes nearest the query that an insertion would have searched for, with their
/// distances, and which index they belong to (never the same for two indexes; a
/// rotation in between makes them useless, and the insertion then searches).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InsertSeeds {
    /// `GraphIndex::id` of the index searched; 0: nothing found.
    pub(crate) index: u64,
    /// Node ids of that index and their distances, ascending.
    pub(crate) nodes: Vec<(u32, f32)>,
}

impl InsertSeeds {
    /// Whether a search left anything here.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// Post-filtering shared by the graph filters: search `ef` nearest, keep the accepted
/// ones, and widen `ef` (×4, `widenings` times) while fewer than `n` survive and the
/// index had more to give. Tombstones are at most half of a generation (rotation), so
/// the first round nearly always suffices. Empty when even the widest round falls short.
pub(crate) fn post_filtered(
    n: usize,
    first_ef: usize,
    widenings: usize,
    accept: &dyn Fn(RepId) -> bool,
    mut search: impl FnMut(usize) -> Vec<(RepId, f32)>,
) -> Vec<(RepId, f32)> {
    let mut ef = first_ef.max(n);
    for _ in 0..=widenings {
        let found = search(ef);
        let exhausted = found.len() < ef;
        let out: Vec<(RepId, f32)> = found
            .into_iter()
            .filter(|(r, _)| accept(*r))
            .take(n)
            .collect();
        if out.len() >= n || exhausted {
            return out;
        }
        ef *= 4;
    }
    Vec::new()
}

/// One empty generation of the given kind (also used by the benchmarks' filter checks).
pub fn new_index(
    kind: FilterKind,
    metric: Metric,
    dim: usize,
    capacity_hint: usize,
) -> Arc<dyn FilterIndex> {
    match kind {
        FilterKind::BruteForce => Arc::new(BruteForceIndex::new(metric)),
        FilterKind::Hnsw {
            m,
            ef_construction,
            ef_search,
        } => Arc::new(GraphIndex::new(metric, dim, m, ef_construction, ef_search)),
        FilterKind::HnswRs {
            m,
            ef_construction,
            ef_search,
        } => Arc::new(HnswIndex::new(
            metric,
            m,
            ef_construction,
            ef_search,
            capacity_hint,
        )),
    }
}

/// What a caller of `FilterSet::candidates` wants besides the vector.
#[derive(Clone, Copy, Debug)]
pub struct CandidateSearch {
    /// Candidates per generation.
    pub n: usize,
    /// Which generations answer while there are two.
    pub mode: StandbySearch,
    /// No candidate farther than this (exact distance) could serve: every generation may
    /// stop there (infinite: no such limit).
    pub reach: f32,
    /// With `StandbySearch::Learned`: search in the order lookups have learned, and
    /// teach it where this search's serving candidate came from (lookups; the owner's
    /// searches, whose candidates are not where lookups' hits are, keep the active
    /// generation first: the insert fast path was 7% slower in the learned order).
    pub learned_order: bool,
}

impl CandidateSearch {
    /// `n` per generation, ALGORITHM.md's rule, no reach.
    pub fn nearest(n: usize) -> Self {
        CandidateSearch {
            n,
            mode: StandbySearch::Nearest,
            reach: f32::INFINITY,
            learned_order: false,
        }
    }
}

/// What readers search: the current generations.
pub struct FilterSet {
    active: Arc<dyn FilterIndex>,
    standby: Arc<dyn FilterIndex>,
    /// The generation being emptied into the active one (see the module docs).
    draining: Option<Arc<dyn FilterIndex>>,
    /// Which of active and standby `StandbySearch::Learned` searches first.
    order: GenerationOrder,
}

/// Hits found only in the generation searched second that swap the order
/// (`GenerationOrder`).
const ORDER_SWAP_VOTES: u32 = 16;

/// The order in which `StandbySearch::Learned` searches the active and standby
/// generations, learned from lookups: an approximate hit found only in the generation
/// searched second is a vote to swap, one found in the first takes a vote back, and
/// `ORDER_SWAP_VOTES` net votes swap. With two generations, a hit on an entry of the one
/// searched second costs a whole search of the first: in the engine bench's state a
/// quarter of a cache's admissions after a rotation, three quarters of the entries are
/// in the standby. Only those events write, so once the order fits the workload readers
/// share this line read-only. Races between readers only blur the count.
/// Reset with every published `FilterSet` (a rotation changes what each generation
/// holds): the active generation first.
#[derive(Default)]
struct GenerationOrder {
    standby_first: AtomicBool,
    votes: AtomicU32,
}

impl GenerationOrder {
    fn standby_first(&self) -> bool {
        self.standby_first.load(Ordering::Relaxed)
    }

    /// A lookup's serving candidate came from the generation searched first.
    fn served_first(&self) {
        if self.votes.load(Ordering::Relaxed) > 0 {
            let _ = self
                .votes
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        }
    }

    /// Only the generation searched second had a serving candidate.
    fn served_second(&self) {
        let votes = self.votes.fetch_add(1, Ordering::Relaxed) + 1;
        if votes >= ORDER_SWAP_VOTES
            && self
                .votes
                .compare_exchange(votes, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.standby_first.fetch_xor(true, Ordering::Relaxed);
        }
    }
}

impl FilterSet {
    /// Active, standby and (while one drains) the draining generation, in that order.
    fn generations(&self) -> [Option<&Arc<dyn FilterIndex>>; 3] {
        [
            Some(&self.active),
            Some(&self.standby),
            self.draining.as_ref(),
        ]
    }

    /// Ids of up to `n` accepted reps per generation, nearest first by the index's
    /// own distance. The caller recomputes exact distances and merges. `serves(r)` is
    /// the caller's own test of a candidate: its exact distance when `r` would answer
    /// the request (within its threshold), so that the generation searched second (the
    /// standby, or with `StandbySearch::Learned` whichever hits have been coming from
    /// less) is only searched for something nearer still, or (`ActiveFirst`, `Learned`)
    /// not at all when the first has a candidate that serves. With `seeds`, the active
    /// generation's search may leave there what admitting `q` needs
    /// (`FilterIndex::search` with `FilterQuery::serves`).
    pub fn candidates(
        &self,
        q: &[f32],
        want: CandidateSearch,
        accept: &dyn Fn(RepId) -> bool,
        serves: &mut dyn FnMut(RepId) -> Option<f32>,
        out: &mut Vec<RepId>,
        mut seeds: Option<&mut InsertSeeds>,
    ) {
        let CandidateSearch {
            n,
            mode,
            reach,
            learned_order,
        } = want;
        let learn = learned_order && mode == StandbySearch::Learned;
        // The generation searched second only matters where it holds something nearer
        // than the first one's n-th candidate, or than its nearest candidate that serves:
        // searched with that bound, a query answered from the first generation costs
        // the second its descent and a few expansions. (Distances here are the index's
        // own; the slack covers the graph's int8 codes.)
        let reach = index_slack(reach);
        let mut bound = reach;
        let mut generations = self.generations();
        let mut active = 0;
        if learn && self.order.standby_first() {
            generations.swap(0, 1);
            active = 1;
        }
        // Whether the first and second generations were searched and had a candidate
        // that serves (for `GenerationOrder`).
        let mut served: [Option<bool>; 2] = [None, None];
        for (i, gen) in generations.into_iter().enumerate() {
            let Some(gen) = gen.filter(|g| !g.is_empty()) else {
                continue;
            };
            // The draining generation is searched whole: its survivors are live entries
            // whose only place is there until they migrate.
            let limit = if i == 2 { reach } else { bound };
            // Each generation stops once it has found a candidate that serves and
            // nothing nearer can turn up (`FilterQuery::serves`).
            let seeds = if i == active { seeds.take() } else { None };
            let want = FilterQuery {
                n,
                accept,
                bound: limit,
                serves: Some(&mut *serves),
                seeds,
            };
            let found = gen.search(q, want);
            if found.len() >= n {
                bound = bound.min(index_slack(found[n - 1].1));
            }
            if i == 0 {
                // The nearest serving candidate of the first generation: the second
                // matters only where it holds one nearer (the first that serves wins).
                let best = found
                    .iter()
                    .filter_map(|&(r, _)| serves(r))
                    .reduce(f32::min);
                served[0] = Some(best.is_some());
                if let Some(d) = best {
                    bound = bound.min(index_slack(d));
                }
                if best.is_some() && mode != StandbySearch::Nearest {
                    out.extend(found.into_iter().map(|(r, _)| r));
                    break;
                }
            } else if i == 1 && learn {
                served[1] = Some(found.iter().any(|&(r, _)| serves(r).is_some()));
            }
            out.extend(found.into_iter().map(|(r, _)| r));
        }
        if learn {
            match served {
                [Some(true), _] => self.order.served_first(),
                [Some(false), Some(true)] => self.order.served_second(),
                _ => {}
            }
        }
    }

    /// Tests: whether `StandbySearch::Learned` now searches the standby first.
    #[cfg(test)]
    fn standby_first(&self) -> bool {
        self.order.standby_first()
    }
}

/// Exact distances computed during one filter search, by representative: a candidate
/// that the search offers to its caller's "would it serve?" test and that the caller
/// then ranks costs one distance (a 3 KB vector at d = 768). A handful of entries per
/// search: a linear scan. (`CacheReader::probe_filter`, `DualFilter::nearest_taker`.)
#[derive(Default)]
pub(crate) struct DistanceMemo(Vec<(RepId, f32)>);

impl DistanceMemo {
    pub(crate) fn with_capacity(n: usize) -> Self {
        DistanceMemo(Vec::with_capacity(n))
    }

    /// `r`'s distance, from `compute` the first time it is asked for (`None`: nothing
    /// to measure, and nothing kept).
    pub(crate) fn get_or_compute(
        &mut self,
        r: RepId,
        compute: impl FnOnce() -> Option<f32>,
    ) -> Option<f32> {
        if let Some(&(_, d)) = self.0.iter().find(|e| e.0 == r) {
            return Some(d);
        }
        let d = compute()?;
        self.0.push((r, d));
        Some(d)
    }
}

/// An exact distance as a bound on the index's own distances (the graph's int8 codes
/// are off by a few percent; infinity stays infinite).
pub(crate) fn index_slack(d: f32) -> f32 {
    d + 0.25 * d.abs() + 1e-6
}

/// Counters for STATS and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilterStats {
    pub live: usize,
    pub tombstones: usize,
    pub rotations: u64,
    /// Survivors re-inserted into the active generation (migrated).
    pub reinserted_on_rotation: u64,
    /// Survivors of the dropped generation still waiting to migrate.
    pub draining: usize,
    /// Live entries of the standby generation: while it has any, a lookup searches two
    /// generations (module docs).
    pub standby_live: usize,
    /// Standby entries moved into the active generation in idle time.
    pub standby_moved: u64,
}

/// Survivors of a dropped generation re-inserted per filter write (module docs): one
/// per write empties a draining generation before the next rotation can come due in
/// every pattern but a pathological one (which then finishes it at once).
const MIGRATIONS_PER_WRITE: usize = 1;
/// The rotation rule's valve (`DualFilter::rotation_due`).
const TOMBSTONES_PER_LIVE_MAX: usize = 3;

struct Members {
    /// Live members with their vectors (kept to re-insert survivors at rotation).
    live: HashMap<RepId, Arc<[f32]>>,
    tombstones: usize,
}

impl Members {
    fn new() -> Self {
        Members {
            live: HashMap::default(),
            tombstones: 0,
        }
    }
}

/// A dropped generation whose live entries are still to migrate.
struct Draining {
    index: Arc<dyn FilterIndex>,
    members: Members,
    /// The order of migration, popped from the end; entries removed meanwhile are
    /// skipped. (Taking the map's first key each time rescans the emptied buckets.)
    queue: Vec<RepId>,
}

/// The owner's side of the filter.
pub struct DualFilter {
    kind: FilterKind,
    standby_search: StandbySearch,
    metric: Metric,
    dim: usize,
    published: Arc<EpochCell<FilterSet>>,
    active: Arc<dyn FilterIndex>,
    standby: Arc<dyn FilterIndex>,
    active_members: Members,
    standby_members: Members,
    /// The dropped standby's index and its live entries not yet migrated.
    draining: Option<Draining>,
    /// The standby's entries in the order idle time moves them (`maintain`), popped
    /// from the end (newest); entries evicted meanwhile are skipped. Built by the first
    /// idle step after a rotation, not by the rotation (sorting a cache's worth of ids
    /// would stall the write that rotated).
    standby_queue: Option<Vec<RepId>>,
    standby_moved: u64,
    rotations: u64,
    reinserted: u64,
    /// Generations no longer published, kept until no retired `FilterSet` holds them
    /// (`reclaim`): without this the last reference would often be the one a reader's
    /// epoch reclamation drops, inside a lookup, and freeing a generation can take
    /// milliseconds (4.7 ms for 100,000 nodes at d = 768 with glibc's malloc).
    retired: Vec<Arc<dyn FilterIndex>>,
}

impl DualFilter {
    pub fn new(kind: FilterKind, metric: Metric, dim: usize) -> Self {
        Self::with_standby_search(kind, metric, dim, StandbySearch::Nearest)
    }

    pub fn with_standby_search(
        kind: FilterKind,
        metric: Metric,
        dim: usize,
        standby_search: StandbySearch,
    ) -> Self {
        let active = new_index(kind, metric, dim, 1024);
        let standby = new_index(kind, metric, dim, 16);
        let published = Arc::new(EpochCell::new(FilterSet {
            active: active.clone(),
            standby: standby.clone(),
            draining: None,
            order: GenerationOrder::default(),
        }));
        DualFilter {
            kind,
            standby_search,
            metric,
            dim,
            published,
            active,
            standby,
            active_members: Members::new(),
            standby_members: Members::new(),
            draining: None,
            standby_queue: None,
            standby_moved: 0,
            rotations: 0,
            reinserted: 0,
            retired: Vec::new(),
        }
    }

    /// Frees the retired generations that no published or retired `FilterSet` holds
    /// any more, here on the owner. Returns how many are still waiting.
    pub fn reclaim(&mut self) -> usize {
        // A count of 1 is ours alone: nothing can clone it again (it is unpublished).
        self.retired.retain(|g| Arc::strong_count(g) > 1);
        self.retired.len()
    }

    /// The cell readers search through.
    pub fn published(&self) -> Arc<EpochCell<FilterSet>> {
        self.published.clone()
    }

    pub fn metric(&self) -> Metric {
        self.metric
    }

    pub fn insert(&mut self, rep: RepId, v: Arc<[f32]>) {
        self.insert_seeded(rep, v, &InsertSeeds::default());
    }

    /// `insert`, from what a lookup of `v` found in the active generation
    /// (`InsertSeeds`; ignored if empty or if the active generation has changed since).
    pub fn insert_seeded(&mut self, rep: RepId, v: Arc<[f32]>, seeds: &InsertSeeds) {
        debug_assert!(!self.contains(rep));
        self.reclaim();
        self.active.insert_seeded(rep, &v, seeds);
        self.active_members.live.insert(rep, v);
        self.migrate(MIGRATIONS_PER_WRITE);
    }

    pub fn contains(&self, rep: RepId) -> bool {
        self.active_members.live.contains_key(&rep)
            || self.standby_members.live.contains_key(&rep)
            || self
                .draining
                .as_ref()
                .is_some_and(|d| d.members.live.contains_key(&rep))
    }

    /// The live entry's vector, wherever it is.
    fn vector(&self, rep: RepId) -> Option<&Arc<[f32]>> {
        self.active_members
            .live
            .get(&rep)
            .or_else(|| self.standby_members.live.get(&rep))
            .or_else(|| {
                self.draining
                    .as_ref()
                    .and_then(|d| d.members.live.get(&rep))
            })
    }

    /// Live entries of the draining generation still to migrate.
    pub fn draining(&self) -> usize {
        self.draining.as_ref().map_or(0, |d| d.members.live.len())
    }

    /// Re-inserts up to `max` live entries of the draining generation into the active
    /// one; drops the draining generation once it holds none. Returns how many moved.
    pub fn migrate(&mut self, max: usize) -> usize {
        let Some(d) = &mut self.draining else {
            return 0;
        };
        let mut moved = 0;
        // Any order will do: each survivor is searched in the draining generation until
        // it is in the active one.
        while moved < max {
            let Some(rep) = d.queue.pop() else {
                break;
            };
            let Some(v) = d.members.live.remove(&rep) else {
                continue; // removed while it waited
            };
            self.active.insert(rep, &v);
            self.active_members.live.insert(rep, v);
            moved += 1;
        }
        self.reinserted += moved as u64;
        if d.members.live.is_empty() {
            let done = self.draining.take().expect("draining").index;
            self.publish();
            self.retired.push(done);
        }
        moved
    }

    fn publish(&self) {
        self.published.store(FilterSet {
            active: self.active.clone(),
            standby: self.standby.clone(),
            draining: self.draining.as_ref().map(|d| d.index.clone()),
            order: GenerationOrder::default(),
        });
    }

    /// Tombstones `rep`, then rotates if tombstones outnumber live entries.
    pub fn remove(&mut self, rep: RepId) -> bool {
        self.reclaim();
        let members = if self.standby_members.live.remove(&rep).is_some() {
            &mut self.standby_members
        } else if self.active_members.live.remove(&rep).is_some() {
            &mut self.active_members
        } else if let Some(Draining { members: m, .. }) = &mut self.draining {
            // Its tombstones do not count: the whole generation is on its way out.
            if m.live.remove(&rep).is_none() {
                return false;
            }
            self.migrate(MIGRATIONS_PER_WRITE);
            return true;
        } else {
            return false;
        };
        members.tombstones += 1;
        if self.rotation_due() {
            self.rotate();
        } else if self.standby_members.live.is_empty() && self.standby_members.tombstones > 0 {
            self.drop_dead_standby();
        }
        self.migrate(MIGRATIONS_PER_WRITE);
        true
    }

    /// The rotation rule (module docs), per generation: once the standby holds no live
    /// entry, seal the active one when more than half of it is tombstones. FIFO eviction
    /// empties the standby first, so a rotation then drops it with nothing to re-insert.
    /// The valve bounds search waste when entries outlive FIFO (invalidations without
    /// evictions): more than 3 tombstones per live entry rotates regardless.
    fn rotation_due(&self) -> bool {
        let (a, s) = (&self.active_members, &self.standby_members);
        (s.live.is_empty() && a.tombstones > a.live.len())
            || self.tombstones() > TOMBSTONES_PER_LIVE_MAX * self.live()
    }

    /// A standby with no live entry left only costs lookups (FIFO empties it within one
    /// cache's worth of admissions after a rotation): replaced by an empty one, so until
    /// the next rotation a lookup searches one generation.
    fn drop_dead_standby(&mut self) {
        let dead = std::mem::replace(
            &mut self.standby,
            new_index(self.kind, self.metric, self.dim, 16),
        );
        self.standby_members = Members::new();
        self.standby_queue = None;
        self.publish();
        self.retired.push(dead);
    }

    /// Idle owner time (module docs): up to `max` re-inserts, draining survivors first,
    /// then the standby's live entries (each leaves a tombstone behind; the last one
    /// drops the standby). Returns how many moved; 0 when there is nothing to do.
    pub fn maintain(&mut self, max: usize) -> usize {
        self.reclaim();
        let mut moved = self.migrate(max);
        if self.draining.is_some() {
            return moved;
        }
        if self.standby_members.live.is_empty() {
            return moved;
        }
        let queue = self.standby_queue.get_or_insert_with(|| {
            let mut q: Vec<RepId> = self.standby_members.live.keys().copied().collect();
            // Newest last, so it moves first: FIFO evicts the oldest anyway.
            q.sort_unstable();
            q
        });
        while moved < max {
            let Some(rep) = queue.pop() else {
                break;
            };
            let Some(v) = self.standby_members.live.remove(&rep) else {
                continue; // evicted while it waited
            };
            self.standby_members.tombstones += 1;
            // Readers may find it in both generations meanwhile: callers merge by id.
            self.active.insert(rep, &v);
            self.active_members.live.insert(rep, v);
            self.standby_moved += 1;
            moved += 1;
        }
        if self.standby_members.live.is_empty() && self.standby_members.tombstones > 0 {
            self.drop_dead_standby();
        }
        moved
    }

    fn rotate(&mut self) {
        // The previous draining must be finished before its slot is reused.
        let left = self.draining();
        self.migrate(left);
        debug_assert!(self.draining.is_none());
        let fresh = new_index(
            self.kind,
            self.metric,
            self.dim,
            self.active_members.live.len().max(1024),
        );
        let sealed = std::mem::replace(&mut self.active, fresh);
        let dropped_index = std::mem::replace(&mut self.standby, sealed);
        let dropped = std::mem::replace(
            &mut self.standby_members,
            std::mem::replace(&mut self.active_members, Members::new()),
        );
        self.standby_queue = None;
        // The artifact loses these; a live representative must stay findable: they are
        // searched where they are until migrated.
        let unpublished = if dropped.live.is_empty() {
            Some(dropped_index)
        } else {
            let mut queue: Vec<RepId> = dropped.live.keys().copied().collect();
            // Newest last, so it migrates first: FIFO may evict the oldest before their
            // turn, and then they need no re-insert at all.
            queue.sort_unstable();
            self.draining = Some(Draining {
                index: dropped_index,
                members: dropped,
                queue,
            });
            None
        };
        self.rotations += 1;
        self.publish();
        self.retired.extend(unpublished);
    }

    /// Up to `n` accepted reps nearest to `q` over every generation, with exact
    /// distances, ascending by (distance, rep). The owner's search (fast path, tests).
    pub fn search(&self, q: &[f32], n: usize, accept: &dyn Fn(RepId) -> bool) -> Vec<(RepId, f32)> {
        let mut ids = Vec::new();
        let live = |r: RepId| self.contains(r) && accept(r);
        // For the single nearest, the active generation's best bounds the standby.
        let mut serves = |r: RepId| {
            let v = self.vector(r).filter(|_| n == 1)?;
            Some(self.metric.distance(q, v))
        };
        let want = CandidateSearch::nearest(n);
        self.published
            .read(|set| set.candidates(q, want, &live, &mut serves, &mut ids, None));
        let mut out: Vec<(RepId, f32)> = ids
            .into_iter()
            .map(|r| {
                let v = self.vector(r).expect("accepted reps are live");
                (r, self.metric.distance(q, v))
            })
            .collect();
        out.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        out.dedup_by_key(|x| x.0);
        out.truncate(n);
        out
    }

    /// The insert fast path's representative: the nearest one over every generation
    /// (`StandbySearch::Nearest`), or the active generation's nearest when `takes` it
    /// (`ActiveFirst`; older generations are searched only otherwise). With its exact
    /// distance; whether it takes the vector is the caller's to check. `reach`: the
    /// largest distance at which any representative could take it (the largest `maxD`):
    /// the searches stop there, and none farther is returned.
    pub fn nearest_taker(
        &self,
        q: &[f32],
        reach: f32,
        takes: &dyn Fn(RepId, f32) -> bool,
    ) -> Option<(RepId, f32)> {
        let mode = self.standby_search;
        let mut ids = Vec::new();
        let live = |r: RepId| self.contains(r);
        // `serves` asks for the candidates the answer is then chosen from (each vector
        // found through a map lookup per generation).
        let mut exact = DistanceMemo::with_capacity(4);
        let mut distance = |r: RepId| -> Option<f32> {
            exact.get_or_compute(r, || Some(self.metric.distance(q, self.vector(r)?)))
        };
        let mut serves = |r: RepId| {
            let d = distance(r)?;
            // Nearest: every candidate bounds the older generations' search.
            (mode == StandbySearch::Nearest || takes(r, d)).then_some(d)
        };
        let want = CandidateSearch {
            n: 1,
            mode,
            reach,
            learned_order: false,
        };
        self.published
            .read(|set| set.candidates(q, want, &live, &mut serves, &mut ids, None));
        ids.into_iter()
            .map(|r| (r, distance(r).expect("accepted reps are live")))
            .filter(|&(_, d)| d <= reach)
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
    }

    pub fn live(&self) -> usize {
        self.active_members.live.len() + self.standby_members.live.len() + self.draining()
    }
    pub fn tombstones(&self) -> usize {
        self.active_members.tombstones + self.standby_members.tombstones
    }
    pub fn stats(&self) -> FilterStats {
        FilterStats {
            live: self.live(),
            tombstones: self.tombstones(),
            rotations: self.rotations,
            reinserted_on_rotation: self.reinserted,
            draining: self.draining(),
            standby_live: self.standby_members.live.len(),
            standby_moved: self.standby_moved,
        }
    }
    /// Drops every generation (FLUSH).
    pub fn clear(&mut self) {
        self.active = new_index(self.kind, self.metric, self.dim, 1024);
        self.standby = new_index(self.kind, self.metric, self.dim, 16);
        self.active_members = Members::new();
        self.standby_members = Members::new();
        self.standby_queue = None;
        self.draining = None;
        self.publish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(x: f32) -> Arc<[f32]> {
        Arc::from(vec![x, 0.0])
    }

    /// A lookup's search leaves insert seeds from the active generation only (here the
    /// standby holds everything near the query), `insert_seeded` links the entry with
    /// them, and seeds left from before a rotation are another index's: the insertion
    /// then searches. The entry is found either way.
    #[test]
    fn insert_seeds_come_from_the_active_generation() {
        let (m, ef_construction, ef_search) = FilterKind::PAPER;
        let kind = FilterKind::Hnsw {
            m,
            ef_construction,
            ef_search,
        };
        let mut f = DualFilter::new(kind, Metric::L2Sq, 2);
        let seeds_for = |f: &DualFilter, x: f32| {
            let (mut seeds, mut ids) = (InsertSeeds::default(), vec![]);
            f.published.read(|set| {
                let want = CandidateSearch::nearest(1);
                set.candidates(
                    &v(x),
                    want,
                    &|_| true,
                    &mut |_| None,
                    &mut ids,
                    Some(&mut seeds),
                )
            });
            seeds
        };
        for r in 0..10 {
            f.insert(r, v(r as f32));
        }
        for r in 2..8 {
            f.remove(r);
        }
        assert_eq!(f.stats().rotations, 1);
        for r in 20..30 {
            f.insert(r, v(r as f32));
        }
        // Nearest 0.5: entries 0 and 1, in the standby; the seeds are the active's.
        let seeds = seeds_for(&f, 0.5);
        assert!(!seeds.is_empty());
        assert!(
            seeds.nodes[0].1 > 300.0,
            "{seeds:?}: the active's nearest is 20"
        );
        f.insert_seeded(40, v(0.5), &seeds);
        let got = f.search(&v(0.5), 1, &|r| r >= 20);
        assert_eq!(got.first().map(|x| x.0), Some(40));
        // Seeds from before a rotation: ignored.
        let stale = seeds_for(&f, 25.5);
        for r in 20..30 {
            f.remove(r);
        }
        assert_eq!(f.stats().rotations, 2);
        f.insert(41, v(100.0));
        f.insert_seeded(42, v(25.5), &stale);
        let got = f.search(&v(25.5), 1, &|_| true);
        assert_eq!(got.first().map(|x| x.0), Some(42));
        // A brute-force filter leaves none.
        let mut b = DualFilter::new(FilterKind::BruteForce, Metric::L2Sq, 2);
        b.insert(1, v(1.0));
        assert!(seeds_for(&b, 0.5).is_empty());
    }

    fn rotation_keeps_survivors(kind: FilterKind) {
        let mut f = DualFilter::new(kind, Metric::L2Sq, 2);
        for r in 0..10 {
            f.insert(r, v(r as f32));
        }
        // Evict most of the first generation, keep 0 and 1 alive in it.
        for r in 2..8 {
            f.remove(r);
        }
        assert!(
            f.stats().rotations >= 1,
            "tombstones 6 > live 4 must rotate"
        );
        for r in 10..30 {
            f.insert(r, v(r as f32));
        }
        for r in 10..28 {
            f.remove(r);
        }
        let s = f.stats();
        assert!(s.rotations >= 2, "{s:?}");
        assert!(s.reinserted_on_rotation >= 2, "{s:?}");
        // Every live representative is still found, each as its own nearest.
        for r in [0u64, 1, 8, 9, 28, 29] {
            assert!(f.contains(r));
            let got = f.search(&v(r as f32), 1, &|_| true);
            assert_eq!(got.first().map(|x| x.0), Some(r), "lost {r} after rotation");
        }
        // Tombstoned ones never come back.
        for r in [2u64, 5, 10, 27] {
            let got = f.search(&v(r as f32), 3, &|_| true);
            assert!(got.iter().all(|x| x.0 != r));
        }
        assert_eq!(f.live(), 6);
    }

    #[test]
    fn rotation_keeps_survivors_brute() {
        rotation_keeps_survivors(FilterKind::BruteForce);
    }

    #[test]
    fn rotation_keeps_survivors_graph() {
        rotation_keeps_survivors(FilterKind::default());
    }

    #[test]
    fn rotation_keeps_survivors_hnsw_rs() {
        let (m, ef_construction, ef_search) = FilterKind::PAPER;
        rotation_keeps_survivors(FilterKind::HnswRs {
            m,
            ef_construction,
            ef_search,
        });
    }

    /// The rotation rule per generation: a FIFO-like pattern rotates only when the
    /// standby is empty (nothing to re-insert); when entries outlive FIFO, the valve
    /// rotates and the survivors stay searchable while they drain, one per filter
    /// write; a rotation that finds the draining unfinished completes it.
    #[test]
    fn rotation_rule_and_incremental_draining() {
        for kind in [FilterKind::default(), FilterKind::BruteForce] {
            let mut f = DualFilter::new(kind, Metric::L2Sq, 2);
            for r in 0..40 {
                f.insert(r, v(r as f32));
            }
            // 21 of 40 dead, standby empty: seal the active once (no second rotation
            // while the sealed generation still holds live entries).
            for r in 0..21 {
                f.remove(r);
            }
            assert_eq!(f.stats().rotations, 1);
            assert_eq!(f.draining(), 0);
            // FIFO: the standby's entries go first; the next rotation waits for its last.
            for r in 100..130 {
                f.insert(r, v(r as f32));
            }
            for r in 21..39 {
                f.remove(r);
            }
            assert_eq!(f.stats().rotations, 1, "the standby still holds entry 39");
            f.remove(39);
            for r in 100..116 {
                f.remove(r); // the active is now more than half dead
            }
            let s = f.stats();
            assert_eq!(s.rotations, 2, "{s:?}");
            assert_eq!(
                (s.reinserted_on_rotation, f.draining()),
                (0, 0),
                "free rotation"
            );

            // Entries that outlive FIFO: the valve (tombstones > 3 x live) drops a
            // standby with survivors, which drain.
            let mut g = DualFilter::new(kind, Metric::L2Sq, 2);
            for r in 0..40 {
                g.insert(r, v(r as f32));
            }
            for r in 0..21 {
                g.remove(r); // rotation 1: 21..40 sealed in the standby
            }
            for r in 100..110 {
                g.insert(r, v(r as f32));
            }
            for r in 100..110 {
                g.remove(r);
            }
            // Standby entries die until tombstones exceed 3 x live (at 27: 38 > 3 x 12).
            let mut next = 21;
            while g.stats().rotations < 2 {
                assert!(next < 40, "the valve never fired");
                g.remove(next);
                next += 1;
            }
            assert_eq!(next, 28);
            let left = g.draining();
            assert_eq!(left, 12 - 1, "28..40 survive; the rotating write moved one");
            let survivors_found = |g: &DualFilter| {
                (28..40u64).all(|r| {
                    g.contains(r)
                        && g.search(&v(r as f32), 1, &|_| true).first().map(|x| x.0) == Some(r)
                })
            };
            assert!(survivors_found(&g), "a survivor was lost while draining");
            // One migration per write: `left` writes empty it.
            for r in 200..200 + left as u64 {
                g.insert(r, v(r as f32));
            }
            assert_eq!(g.draining(), 0);
            assert_eq!(g.stats().reinserted_on_rotation, 12);
            assert!(survivors_found(&g), "a survivor was lost by migrating");

            // An unfinished draining is completed by the next rotation.
            let mut h = DualFilter::new(kind, Metric::L2Sq, 2);
            for r in 0..40 {
                h.insert(r, v(r as f32));
            }
            let mut next = 0;
            while h.stats().rotations < 2 {
                assert!(next < 40, "the valve never fired");
                h.remove(next); // rotation at 20, the valve at 30
                next += 1;
            }
            assert!(h.draining() > 0);
            let live = h.live();
            h.rotate();
            assert_eq!((h.draining(), h.live()), (0, live));
            for r in next..40 {
                assert_eq!(h.search(&v(r as f32), 1, &|_| true)[0].0, r);
            }
        }
    }

    /// Every generation that stops being published (dead standby, finished draining,
    /// rotation) is held by the owner until no retired FilterSet holds it, then freed.
    #[test]
    fn retired_generations_are_freed_by_the_owner() {
        let mut f = DualFilter::new(FilterKind::default(), Metric::L2Sq, 2);
        let mut seen: Vec<std::sync::Weak<dyn FilterIndex>> = Vec::new();
        let published = |f: &DualFilter| -> Vec<*const ()> {
            f.published.read(|s| {
                s.generations()
                    .into_iter()
                    .flatten()
                    .map(|g| Arc::as_ptr(g) as *const ())
                    .collect()
            })
        };
        let mut watch = |f: &DualFilter| {
            f.published.read(|s| {
                for g in s.generations().into_iter().flatten() {
                    if !seen
                        .iter()
                        .any(|w| w.as_ptr() as *const () == Arc::as_ptr(g) as *const ())
                    {
                        seen.push(Arc::downgrade(g));
                    }
                }
            })
        };
        // FIFO: rotations, dead standbys dropped.
        for r in 0..1000u64 {
            f.insert(r, v(r as f32));
            watch(&f);
            if r >= 200 {
                f.remove(r - 200);
                watch(&f);
            }
        }
        // Entries outliving FIFO: the valve rotates with survivors in the standby,
        // which drain, and idle time finishes them.
        let mut drained = false;
        for r in (800..1000u64).rev().skip(10) {
            f.remove(r);
            watch(&f);
            drained |= f.stats().draining > 0;
        }
        while f.maintain(7) > 0 {
            watch(&f);
        }
        let s = f.stats();
        assert!(drained && s.rotations >= 3 && s.draining == 0, "{s:?}");
        let now = published(&f);
        let gone: Vec<_> = seen
            .iter()
            .filter(|w| !now.contains(&(w.as_ptr() as *const ())))
            .collect();
        assert!(gone.len() >= 4, "{} generations unpublished", gone.len());
        // Readers' epoch reclamation releases every retired FilterSet (all at once
        // here): no generation is freed by it, the owner holds each ...
        // SAFETY: no other thread exists in this test, so none is inside `read`.
        unsafe { f.published.reclaim_all() };
        assert!(
            gone.iter().all(|w| w.strong_count() == 1),
            "a generation freed by a reader's reclamation, or still published"
        );
        // ... and frees them on its next write or idle step.
        assert_eq!(f.reclaim(), 0);
        assert!(gone.iter().all(|w| w.strong_count() == 0));
    }

    /// FIFO after a rotation: entries of both generations stay findable; once the
    /// standby's last entry is evicted it is dropped at once (one generation searched);
    /// idle time moves the standby's entries over (newest first), then drops it.
    #[test]
    fn standby_is_dropped_when_dead_and_emptied_in_idle_time() {
        for kind in [FilterKind::default(), FilterKind::BruteForce] {
            let x = |r: u64| {
                if r >= 1000 {
                    r as f32 - 799.5
                } else {
                    r as f32
                }
            };
            let found_all = |f: &DualFilter, live: &[u64]| {
                live.iter()
                    .all(|&r| f.search(&[x(r), 0.0], 1, &|_| true).first().map(|c| c.0) == Some(r))
            };
            let standby_empty = |f: &DualFilter| f.published.read(|s| s.standby.is_empty());
            let sealed = |f: &mut DualFilter| {
                for r in 0..200 {
                    f.insert(r, v(x(r)));
                }
                for r in 0..101 {
                    f.remove(r); // rotation: 101..200 sealed in the standby
                }
                for r in 1000..1100 {
                    f.insert(r, v(x(r))); // interleaved with the standby's
                }
                let s = f.stats();
                assert_eq!((s.rotations, s.standby_live, s.live), (1, 99, 199));
            };

            let mut f = DualFilter::new(kind, Metric::L2Sq, 2);
            sealed(&mut f);
            let live: Vec<u64> = (101..200).chain(1000..1100).collect();
            assert!(found_all(&f, &live), "{kind:?}");
            for r in 101..199 {
                f.remove(r);
            }
            assert_eq!(f.stats().standby_live, 1);
            assert!(!standby_empty(&f));
            f.remove(199);
            let s = f.stats();
            assert_eq!((s.standby_live, s.rotations, s.live), (0, 1, 100), "{s:?}");
            assert!(standby_empty(&f), "dead standby kept");
            let live: Vec<u64> = (1000..1100).collect();
            assert!(found_all(&f, &live), "{kind:?}");
            assert_eq!(f.maintain(8), 0, "nothing to do");

            // Idle time: 10 moves per step, newest first; FIFO evictions meanwhile.
            let mut g = DualFilter::new(kind, Metric::L2Sq, 2);
            sealed(&mut g);
            assert_eq!(g.maintain(10), 10);
            let s = g.stats();
            assert_eq!((s.standby_live, s.standby_moved, s.live), (89, 10, 199));
            assert!(g.active_members.live.contains_key(&199));
            assert!(g.standby_members.live.contains_key(&101));
            let live: Vec<u64> = (101..200).chain(1000..1100).collect();
            assert!(found_all(&g, &live), "lost while moving ({kind:?})");
            for r in 101..111 {
                g.remove(r); // evicted before their turn: skipped
            }
            let mut steps = 0;
            while g.maintain(10) > 0 {
                steps += 1;
                assert!(steps <= 8, "idle work never ends");
            }
            let s = g.stats();
            assert_eq!(
                (s.standby_live, s.standby_moved, s.live),
                (0, 89, 189),
                "{s:?}"
            );
            assert!(standby_empty(&g), "emptied standby kept");
            let live: Vec<u64> = (111..200).chain(1000..1100).collect();
            assert!(found_all(&g, &live), "lost by moving ({kind:?})");
            // The moved entries leave the standby's tombstones behind, not the active's.
            assert_eq!(g.tombstones(), 0);
        }
    }

    #[test]
    fn search_merges_generations_nearest_first() {
        let mut f = DualFilter::new(FilterKind::BruteForce, Metric::L2Sq, 2);
        for r in 0..4 {
            f.insert(r, v(r as f32 * 10.0));
        }
        for r in 0..3 {
            f.remove(r); // rotates: 3 moves on, the rest are tombstones
        }
        f.insert(7, v(29.0));
        let got = f.search(&[28.0, 0.0], 2, &|_| true);
        assert_eq!(got, vec![(7, 1.0), (3, 4.0)]);
        // the predicate is honoured
        let got = f.search(&[28.0, 0.0], 2, &|r| r != 7);
        assert_eq!(got, vec![(3, 4.0)]);
    }

    /// `StandbySearch::Learned`: lookups served only by the generation searched second
    /// swap the order after `ORDER_SWAP_VOTES` net votes; hits in the first take votes
    /// back; once swapped, a hit in the standby costs no search of the active one;
    /// the owner's searches do not vote; a new published set starts active first.
    #[test]
    fn learned_order_follows_where_hits_come_from() {
        for kind in [FilterKind::BruteForce, FilterKind::default()] {
            let mut f =
                DualFilter::with_standby_search(kind, Metric::L2Sq, 2, StandbySearch::Learned);
            // 0..8 at 0, 10, …; removing 0..4 rotates: 4..8 move to the standby.
            for r in 0..8 {
                f.insert(r, v(r as f32 * 10.0));
            }
            for r in 0..5 {
                f.remove(r);
            }
            for r in 20..24 {
                f.insert(r, v(r as f32 * 10.0));
            }
            assert_eq!(f.stats().standby_live, 3, "{kind:?}");
            let cell = f.published();
            // A lookup of entry `r` (at r·10), served only by `r` itself.
            let lookup = |r: RepId| -> Vec<RepId> {
                let q = [r as f32 * 10.0 + 0.5, 0.0];
                let mut serves = |x: RepId| (x == r).then_some(0.25);
                let mut ids = Vec::new();
                let want = CandidateSearch {
                    mode: StandbySearch::Learned,
                    learned_order: true,
                    ..CandidateSearch::nearest(1)
                };
                cell.read(|set| set.candidates(&q, want, &|_| true, &mut serves, &mut ids, None));
                assert!(ids.contains(&r), "{kind:?}: {r} not found in {ids:?}");
                ids
            };
            let standby_first = || cell.read(|set| set.standby_first());
            // Votes taken back by hits in the first generation: no swap.
            for _ in 0..ORDER_SWAP_VOTES - 1 {
                lookup(6);
            }
            for _ in 0..ORDER_SWAP_VOTES {
                lookup(21);
            }
            for _ in 0..ORDER_SWAP_VOTES - 1 {
                lookup(6);
            }
            assert!(!standby_first(), "{kind:?}: swapped on votes taken back");
            // The owner's searches do not vote.
            for _ in 0..2 * ORDER_SWAP_VOTES {
                f.search(&[60.5, 0.0], 1, &|_| true);
            }
            assert!(!standby_first(), "{kind:?}: the owner's searches voted");
            assert_eq!(lookup(6), vec![20, 6], "{kind:?}: the active one first");
            assert!(standby_first(), "{kind:?}: the last vote swaps");
            assert_eq!(lookup(5), vec![5], "{kind:?}: the standby alone answers");
            // Hits on the active generation swap it back.
            for _ in 0..ORDER_SWAP_VOTES {
                lookup(20);
            }
            assert!(!standby_first(), "{kind:?}: not swapped back");
            // A new published set (here: the standby emptied) starts active first.
            for _ in 0..ORDER_SWAP_VOTES {
                lookup(7);
            }
            assert!(standby_first());
            for r in 5..8 {
                f.remove(r);
            }
            assert_eq!(f.stats().standby_live, 0);
            assert!(!f.published().read(|set| set.standby_first()));
        }
    }

    #[test]
    fn active_first_answers_from_the_newest_generation_that_serves() {
        for kind in [FilterKind::BruteForce, FilterKind::default()] {
            for mode in [StandbySearch::Nearest, StandbySearch::ActiveFirst] {
                let mut f = DualFilter::with_standby_search(kind, Metric::L2Sq, 2, mode);
                for r in 0..4 {
                    f.insert(r, v(r as f32 * 10.0));
                }
                for r in 0..3 {
                    f.remove(r); // rotates: 3 (at 30) is in the standby now
                }
                assert_eq!(f.stats().standby_live, 1, "{kind:?}");
                f.insert(7, v(29.0));
                let q = [30.5, 0.0];
                // The fast path's representative: 3 is nearer, 7 is the newer one.
                let got = f
                    .nearest_taker(&q, f32::INFINITY, &|_, _| true)
                    .map(|x| x.0);
                let want = if mode == StandbySearch::Nearest { 3 } else { 7 };
                assert_eq!(got, Some(want), "{kind:?} {mode:?}");
                // When the active generation's candidate does not take it, the standby
                // is searched in both modes.
                let got = f
                    .nearest_taker(&q, f32::INFINITY, &|r, _| r != 7)
                    .map(|x| x.0);
                assert_eq!(got, Some(3), "{kind:?} {mode:?}");
                // Nothing farther than the reach (3 is 0.25 away, 7 2.25).
                assert_eq!(f.nearest_taker(&q, 0.2, &|_, _| true), None);
                let got = f.nearest_taker(&q, 1.0, &|r, _| r != 7);
                assert_eq!(got, Some((3, 0.25)), "{kind:?} {mode:?}");
                // A lookup's candidates: the standby's only when the active's does not serve.
                for (active_serves, want) in [(true, mode == StandbySearch::Nearest), (false, true)]
                {
                    let mut ids = Vec::new();
                    let mut serves = |r: RepId| {
                        let x = if r == 7 { 29.0 } else { r as f32 * 10.0 };
                        let d = Metric::L2Sq.distance(&q, &v(x));
                        (active_serves || r != 7).then_some(d)
                    };
                    f.published().read(|set| {
                        let want = CandidateSearch {
                            mode,
                            ..CandidateSearch::nearest(1)
                        };
                        set.candidates(&q, want, &|_| true, &mut serves, &mut ids, None)
                    });
                    assert_eq!(ids.contains(&3), want, "{kind:?} {mode:?} {active_serves}");
                    assert!(ids.contains(&7));
                }
            }
        }
    }
}
