//! The read side of a shard: what any core may search without waiting for the owner.
//!
//! ```text
//!  lookup(q, k)  (&self: no lock of ours, never waits for the owner)
//!    ├─ exact table ── representative ─► Exact hit      τ ← min(τ·α_L, minD)   (CAS)
//!    │               └ alias ──────────► Alias hit      τ unchanged
//!    ├─ filter set (every generation): nearest candidates, exact d(q, RQ),
//!    │  first with d < τ ──────────────► Approximate    τ ← τ·α_T (CAS); the alias
//!    │                                                  link is handed back for the owner
//!    └─ otherwise ─────────────────────► Miss ticket (insert / delete sequence numbers)
//! ```
//!
//! Every structure here is either a papaya map (lock-free, seize-reclaimed) or an
//! `EpochCell`; views are immutable once published, so a reader never sees a list
//! half-updated. Clippy's `disallowed-types` (see `clippy.toml`) keeps `Mutex` and
//! `RwLock` out of this module.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::config::CacheConfig;
use crate::counter::Counter;
use crate::entry::{NeighborList, RepId, RepView};
use crate::epoch::EpochCell;
use crate::error::{validate_k, validate_vector, Result};
use crate::exact_table::{QueryKey, Slot};
use crate::filter::{CandidateSearch, DistanceMemo, FilterSet, InsertSeeds};
use crate::gap::Gauge;
use crate::hash::SharedMap;
use crate::policy::HitPolicy;
use crate::recent::{OutOfWindow, RecentInserts};

/// A hit on an entry at least this many records behind asks its owner to catch it up
/// even when none of them belonged in its list: its hits would scan them all again.
pub(crate) const CATCH_UP_BEHIND: u64 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HitKind {
    /// The query is a representative's own.
    Exact,
    /// The query was served by an approximate hit before and is linked.
    Alias,
    /// A near representative passed its threshold.
    Approximate,
    Miss,
}

impl HitKind {
    pub fn name(self) -> &'static str {
        match self {
            HitKind::Exact => "exact",
            HitKind::Alias => "alias",
            HitKind::Approximate => "approximate",
            HitKind::Miss => "miss",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Neighbor {
    pub id: u64,
    pub distance: f32,
}

#[derive(Clone, Debug)]
pub struct Hit {
    pub kind: HitKind,
    pub rep: RepId,
    /// Exactly `k` live results ascending by `distance`.
    pub results: Vec<Neighbor>,
    /// Distances are to the request's own vector; false only when the cache keeps no
    /// vectors and served a near query (then they are to the representative's query).
    pub exact_distances: bool,
    /// A key the owner should link as an alias of `rep`.
    pub link: Option<QueryKey>,
    /// The entry is behind the insert log: its owner should catch it up
    /// (`OwnerMsg::CatchUp`; this hit added what it lacked itself).
    pub catch_up: Option<RepId>,
}

/// What a miss must carry to the owner for admission.
#[derive(Clone, Debug)]
pub struct MissTicket {
    pub query: Arc<[f32]>,
    pub k: usize,
    pub key: QueryKey,
    /// Insert-log sequence number noted before the backend call: the entry's `LC`.
    pub insert_seq: u64,
    /// Delete sequence number noted before the backend call: ids deleted after it are
    /// stripped from the answer at admission.
    pub delete_seq: u64,
    /// A sampled verification of this cached top-k (Potluck+).
    pub verify: Option<Vec<u64>>,
    /// Replace an existing representative of the same key (REFRESH).
    pub replace: bool,
    /// What the lookup's filter search found for admitting the query (empty when
    /// there was no lookup, or its search of the active generation stopped early).
    pub seeds: InsertSeeds,
    /// An entry that would have served but is further behind the insert log than a hit
    /// checks (`hit_check_records_max`): its owner should catch it up.
    pub catch_up: Option<RepId>,
}

#[derive(Clone, Debug)]
pub enum Lookup {
    Hit(Hit),
    Miss(MissTicket),
}

/// Counters; the hit path bumps striped ones.
#[derive(Debug, Default)]
pub struct Counters {
    pub lookups: Counter,
    pub exact_hits: Counter,
    pub alias_hits: Counter,
    pub approximate_hits: Counter,
    pub misses: Counter,
    pub verifications: Counter,
    pub admissions: Counter,
    pub admissions_refused: Counter,
    pub evictions: Counter,
    pub invalidations: Counter,
    pub log_cap_invalidations: Counter,
    pub deletes: Counter,
    pub delete_repairs: Counter,
    pub inserts: Counter,
    pub fast_path_updates: Counter,
    pub slow_path_steps: Counter,
    pub slow_path_merges: Counter,
    /// Entries caught up at a hit's request (`Cache::catch_up`).
    pub catch_ups: Counter,
    /// Hits that added inserts their entry had not accounted for yet (`recent.rs`).
    pub hits_with_recent: Counter,
    /// Lookups whose entry was further behind than the hit check reaches: answered as
    /// misses.
    pub hits_behind: Counter,
    pub aliases_linked: Counter,
    /// Alias hits turned into misses that admit the query itself (`promotes_aliases`).
    pub alias_promotions: Counter,
}

pub struct CacheReader {
    pub(crate) cfg: CacheConfig,
    pub(crate) policy: Arc<dyn HitPolicy>,
    pub(crate) table: SharedMap<QueryKey, Slot>,
    pub(crate) reps: SharedMap<RepId, RepView>,
    pub(crate) filter: Arc<EpochCell<FilterSet>>,
    /// Last insert-log / delete sequence numbers, published by the owner after it
    /// applied them (the backend had applied them before that).
    pub(crate) insert_seq: AtomicU64,
    pub(crate) delete_seq: AtomicU64,
    /// The newest insert-log records, checked by hits on entries behind them.
    pub(crate) recent: Arc<RecentInserts>,
    pub(crate) counters: Counters,
    /// A slow-path credit is queued for the owner (coalesces credits from many cores).
    pub(crate) credit_pending: std::sync::atomic::AtomicBool,
    /// f32 bits of the factor every approximate-hit threshold is multiplied by (1.0:
    /// the policy's own); the recall floor's controller sets it (`floor.rs`).
    pub(crate) threshold_scale: std::sync::atomic::AtomicU32,
}

impl CacheReader {
    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The factor approximate hits' thresholds are multiplied by (`set_threshold_scale`).
    pub fn threshold_scale(&self) -> f32 {
        f32::from_bits(self.threshold_scale.load(Ordering::Relaxed))
    }

    /// Scales every entry's threshold for approximate hits from the next lookup on: the
    /// recall floor tightens them (`< 1`) and relaxes them back. Entries keep their own
    /// `τ`; exact and alias hits do not depend on it.
    pub fn set_threshold_scale(&self, scale: f32) {
        assert!(scale.is_finite() && scale >= 0.0, "threshold scale {scale}");
        self.threshold_scale
            .store(scale.to_bits(), Ordering::Relaxed);
    }

    pub fn validate_request(&self, q: &[f32], k: usize) -> Result<()> {
        validate_vector(q, self.cfg.dim)?;
        validate_k(k, self.cfg.k_max)
    }

    /// Algorithm 1. Takes `&self`: it reads, and updates `τ` by compare-and-swap.
    pub fn lookup(&self, q: &[f32], k: usize) -> Result<Lookup> {
        self.validate_request(q, k)?;
        self.counters.lookups.bump();
        let key = QueryKey::new(q);
        if let Some(hit) = self.probe_exact(q, k, key) {
            return Ok(hit);
        }
        let mut seeds = InsertSeeds::default();
        let mut behind = None;
        if let Some(hit) = self.probe_filter_seeded(q, k, key, Some(&mut seeds), &mut behind) {
            return Ok(hit);
        }
        self.counters.misses.bump();
        let ticket = self.ticket(q, k, key, None, false);
        Ok(Lookup::Miss(MissTicket {
            seeds,
            catch_up: behind,
            ..ticket
        }))
    }

    /// Step 1: the exact table. `None` also when the slot's representative is gone
    /// (removed between the two reads): the lookup goes on as if the key were absent.
    /// An entry cached for `k` answers `k' <= k` from its prefix; asked for more, it is
    /// a miss that replaces the entry with the larger answer.
    pub fn probe_exact(&self, q: &[f32], k: usize, key: QueryKey) -> Option<Lookup> {
        let slot = self.table.pin().get(&key).copied()?;
        let reps = self.reps.pin();
        let rep = reps.get(&slot.rep())?;
        if k > rep.k {
            self.counters.misses.bump();
            let replace = matches!(slot, Slot::Representative(_));
            return Some(Lookup::Miss(self.ticket(q, k, key, None, replace)));
        }
        let kind = match slot {
            Slot::Representative(_) => {
                // Potluck+ drops out of equality hits too: a repeat verifies the
                // threshold (the paper: "equality hits gradually loosen" it).
                if self.policy.sample_verification() {
                    self.counters.verifications.bump();
                    self.counters.misses.bump();
                    let cached = self.served_ids(rep, k);
                    return Some(Lookup::Miss(self.ticket(q, k, key, Some(cached), false)));
                }
                HitKind::Exact
            }
            Slot::Alias(_) if self.policy.promotes_aliases() => {
                // A near query asked again: it earns its own exact answer instead of
                // the neighbour's approximate one (admission replaces the alias).
                self.counters.alias_promotions.bump();
                self.counters.misses.bump();
                return Some(Lookup::Miss(self.ticket(q, k, key, None, false)));
            }
            Slot::Alias(_) => HitKind::Alias,
        };
        let Ok(hit) = self.answer(rep, q, k, kind, None) else {
            // Too far behind to check: the backend answers. The entry's own query at its
            // k replaces it with that answer (one admission, however far behind it
            // was); otherwise its owner catches it up.
            self.counters.misses.bump();
            let replace = kind == HitKind::Exact && k == rep.k;
            let ticket = self.ticket(q, k, key, None, replace);
            let catch_up = if replace {
                None
            } else {
                self.ask_catch_up(rep)
            };
            return Some(Lookup::Miss(MissTicket { catch_up, ..ticket }));
        };
        if kind == HitKind::Exact {
            self.policy.on_equality_hit(rep);
            self.counters.exact_hits.bump();
        } else {
            self.counters.alias_hits.bump();
        }
        Some(Lookup::Hit(hit))
    }

    /// Step 2: the filter's nearest candidates, first one within its threshold.
    pub fn probe_filter(&self, q: &[f32], k: usize, key: QueryKey) -> Option<Lookup> {
        self.probe_filter_seeded(q, k, key, None, &mut None)
    }

    /// `probe_filter`, leaving in `seeds` what admitting `q` to this shard would
    /// search the filter for (`MissTicket::seeds`), should it miss, and in `behind` an
    /// entry that would have served but is too far behind the insert log
    /// (`MissTicket::catch_up`).
    pub fn probe_filter_seeded(
        &self,
        q: &[f32],
        k: usize,
        key: QueryKey,
        seeds: Option<&mut InsertSeeds>,
        behind: &mut Option<RepId>,
    ) -> Option<Lookup> {
        let reps = self.reps.pin();
        // Entries cached for at least `k` answer from their prefix.
        let holds_k = |r: RepId| reps.get(&r).is_some_and(|e| e.k >= k);
        let n = self.cfg.filter_candidates;
        let mut ids = Vec::with_capacity(2 * n);
        // Exact distances computed while the filter asks whether a candidate serves
        // (`FilterSet::candidates`), kept for the merge below.
        let mut exact = DistanceMemo::with_capacity(n);
        // Distances in the filter's unit; thresholds compare their gap (`gap.rs`).
        let gauge = Gauge(self.cfg.metric);
        let fq = gauge.filter_query(q);
        let scale = self.threshold_scale();
        let distance =
            |view: &RepView| Some(gauge.filter_distance(&fq, &view.query, view.query_norm));
        let mut serves = |r: RepId| {
            let view = reps.get(&r)?;
            let d = exact.get_or_compute(r, || distance(view))?;
            (gauge.gap(d) < self.policy.threshold(view) * scale).then_some(d)
        };
        let want = CandidateSearch {
            mode: self.cfg.standby_search,
            learned_order: true,
            ..CandidateSearch::nearest(n)
        };
        self.filter
            .read(|set| set.candidates(&fq, want, &holds_k, &mut serves, &mut ids, seeds));
        let mut cands: Vec<(f32, RepId, &RepView)> = Vec::with_capacity(ids.len());
        for r in ids {
            if let Some(view) = reps.get(&r) {
                if cands.iter().all(|c| c.1 != r) {
                    let d = exact.get_or_compute(r, || distance(view));
                    cands.push((d.expect("a view has a distance"), r, view));
                }
            }
        }
        cands.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut skipped: Option<&RepView> = None;
        for &(d, _, rep) in cands.iter().take(n) {
            if gauge.gap(d) < self.policy.threshold(rep) * scale {
                if self.policy.sample_verification() {
                    self.counters.verifications.bump();
                    self.counters.misses.bump();
                    let cached = self.served_ids(rep, k);
                    return Some(Lookup::Miss(self.ticket(q, k, key, Some(cached), false)));
                }
                let link = self.policy.links_aliases().then_some(key);
                let Ok(hit) = self.answer(rep, q, k, HitKind::Approximate, link) else {
                    // The next candidate may serve; should none, this one is caught up.
                    skipped = skipped.or(Some(rep));
                    continue;
                };
                self.policy.on_approximate_hit(rep);
                self.counters.approximate_hits.bump();
                return Some(Lookup::Hit(hit));
            }
        }
        *behind = skipped.and_then(|rep| self.ask_catch_up(rep));
        None
    }

    pub(crate) fn ticket(
        &self,
        q: &[f32],
        k: usize,
        key: QueryKey,
        verify: Option<Vec<u64>>,
        replace: bool,
    ) -> MissTicket {
        MissTicket {
            query: Arc::from(q),
            k,
            key,
            insert_seq: self.insert_seq.load(Ordering::Acquire),
            delete_seq: self.delete_seq.load(Ordering::Acquire),
            verify,
            replace,
            seeds: InsertSeeds::default(),
            catch_up: None,
        }
    }

    /// Marks `rep` as asked to catch up; `Some` for the one lookup that asks first (the
    /// request goes to the owner), `None` while a request is outstanding.
    fn ask_catch_up(&self, rep: &RepView) -> Option<RepId> {
        let asked = &rep.state.catch_up_asked;
        (!asked.load(Ordering::Relaxed) && !asked.swap(true, Ordering::AcqRel)).then_some(rep.id)
    }

    /// A catch-up request for `rep` did not reach its owner (its queue was full): the
    /// next hit that finds the entry behind asks again.
    pub fn catch_up_dropped(&self, rep: RepId) {
        if let Some(view) = self.reps.pin().get(&rep) {
            view.state.catch_up_asked.store(false, Ordering::Release);
        }
    }

    /// `rep`'s list with the inserts it has not accounted for merged in, record by
    /// record as its owner would merge them (`Cache::scan_log`: closer than the list's
    /// `maxD` as it stands, live, not listed; what falls past `k + Δ` dropped), so a hit
    /// answers what the entry answers once caught up. `None` when nothing was added.
    /// With it, how many records the entry is behind. `Err` when it is further behind
    /// than the window of recent inserts reaches.
    fn with_recent(
        &self,
        rep: &RepView,
        last: u64,
    ) -> Result<(Option<NeighborList>, u64), OutOfWindow> {
        if rep.cursor >= last {
            return Ok((None, 0));
        }
        let nrl = &rep.nrl;
        let cap = (rep.k + self.cfg.delta).max(nrl.len());
        let mut merged: Option<NeighborList> = None;
        self.recent.scan(rep.cursor, last, |r| {
            let list = merged.as_ref().unwrap_or(nrl);
            let d = self.cfg.metric.distance(&r.vector, &rep.query);
            if d < list.max_d() && list.position(r.id).is_none() {
                let list = merged.get_or_insert_with(|| (**nrl).clone());
                let v = self.cfg.store_vectors.then(|| r.vector.clone());
                list.insert_sorted(r.id, d, v);
                if list.len() > cap {
                    list.remove_at(cap);
                }
            }
        })?;
        Ok((merged, last - rep.cursor))
    }

    /// `answer`'s part for an entry behind the log: its list with what it lacks, and the
    /// catch-up to ask for: when the hit added something (the owner then keeps it), or
    /// when the entry is far enough behind that its hits keep scanning many records.
    #[cold]
    #[inline(never)]
    fn behind_hit(
        &self,
        rep: &RepView,
        last: u64,
    ) -> Result<(Option<NeighborList>, Option<RepId>), OutOfWindow> {
        let (recent, behind) = self.with_recent(rep, last).inspect_err(|_| {
            self.counters.hits_behind.bump();
        })?;
        if recent.is_some() {
            self.counters.hits_with_recent.bump();
        }
        let catch_up = if recent.is_some() || behind >= CATCH_UP_BEHIND {
            self.ask_catch_up(rep)
        } else {
            None
        };
        Ok((recent, catch_up))
    }

    /// The ids a hit on `rep` serves first (its list with the inserts it lacks), for a
    /// sampled verification; the list's own when the entry is too far behind to tell.
    fn served_ids(&self, rep: &RepView, k: usize) -> Vec<u64> {
        match self.with_recent(rep, self.insert_seq.load(Ordering::Acquire)) {
            Ok((Some(list), _)) => list.ids[..k].to_vec(),
            _ => rep.nrl.ids[..k].to_vec(),
        }
    }

    /// A ticket for a miss that skips the lookup: REFRESH (replace the entry) or a
    /// bypass that still admits.
    pub fn miss_ticket(&self, q: &[f32], k: usize, replace: bool) -> Result<MissTicket> {
        self.validate_request(q, k)?;
        Ok(self.ticket(q, k, QueryKey::new(q), None, replace))
    }

    /// The `k` results a hit returns, ascending by distance to the request's vector,
    /// with every acknowledged insert the entry takes (`with_recent`). `Err` when the
    /// entry is too far behind to tell.
    fn answer(
        &self,
        rep: &RepView,
        q: &[f32],
        k: usize,
        kind: HitKind,
        link: Option<QueryKey>,
    ) -> Result<Hit, OutOfWindow> {
        // The common case, an entry up to date, costs this one load.
        let last = self.insert_seq.load(Ordering::Acquire);
        let (recent, catch_up) = if rep.cursor >= last {
            (None, None)
        } else {
            self.behind_hit(rep, last)?
        };
        let nrl = recent.as_ref().unwrap_or(&rep.nrl);
        debug_assert!(nrl.len() >= k, "a representative holds at least k results");
        // Only a store, and only when not set yet: a hot entry's line is not written
        // on every hit.
        if !rep.state.referenced.load(Ordering::Relaxed) {
            rep.state.referenced.store(true, Ordering::Relaxed);
        }
        let mut exact_distances = true;
        let mut results: Vec<Neighbor>;
        if kind == HitKind::Exact {
            results = (0..k)
                .map(|i| Neighbor {
                    id: nrl.ids[i],
                    distance: nrl.dists[i],
                })
                .collect();
        } else {
            let pool = if self.policy.rerank() { nrl.len() } else { k };
            results = Vec::with_capacity(pool);
            for i in 0..pool {
                let distance = match &nrl.vectors[i] {
                    Some(v) => self.cfg.metric.distance(q, v),
                    None => {
                        exact_distances = false;
                        nrl.dists[i]
                    }
                };
                results.push(Neighbor {
                    id: nrl.ids[i],
                    distance,
                });
            }
            results.sort_by(|a, b| a.distance.total_cmp(&b.distance).then(a.id.cmp(&b.id)));
            results.truncate(k);
        }
        Ok(Hit {
            kind,
            rep: rep.id,
            results,
            exact_distances,
            link,
            catch_up,
        })
    }

    /// Number of published representatives.
    pub fn len(&self) -> usize {
        self.reps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reps.is_empty()
    }

    /// The `k` the representative of `key` was cached for (`None`: no representative;
    /// an alias answers with another entry's list).
    pub fn representative_k(&self, key: QueryKey) -> Option<usize> {
        match self.table.pin().get(&key).copied()? {
            Slot::Representative(r) => self.reps.pin().get(&r).map(|v| v.k),
            Slot::Alias(_) => None,
        }
    }

    /// The slot of `q` (whatever `k` its entry was cached for).
    pub fn slot(&self, q: &[f32]) -> Option<Slot> {
        self.table.pin().get(&QueryKey::new(q)).copied()
    }
}
