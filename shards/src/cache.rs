//! One shard of the approximate result cache: lookup (Algorithm 1), admission and FIFO
//! eviction (§4.5, §4.7), deletes (§4.6). Inserts and refresh live in `refresh.rs`.
//!
//! ```text
//!  lookup(q, k)  (&self: reads, and CAS on τ only)
//!    ├─ exact table ── representative ─► Exact hit      τ ← min(τ·α_L, minD)
//!    │               └ alias ──────────► Alias hit      τ unchanged
//!    ├─ dual filter: nearest candidates, first with d(q, RQ) < τ
//!    │                                 ► Approximate    τ ← τ·α_T, link alias (owner)
//!    └─ otherwise ─────────────────────► Miss ticket (insert / delete sequence numbers)
//!
//!  owner (&mut self): link_alias, admit(ticket, answer), insert, delete, refresh
//! ```
//!
//! Lookup never mutates structure: what a hit wants changed (an alias link, slow-path
//! credit) is handed back to the caller, who applies it on the owner. The concurrent
//! engine sends exactly these on a channel.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::backend::{sort_candidates, Backend, Candidate};
use crate::config::{CacheConfig, Capacity};
use crate::entry::{AtomicF32, NeighborList, RepId, Representative};
use crate::error::{validate_k, validate_vector, Result};
use crate::exact_table::{ExactTable, QueryKey, Slot};
use crate::filter::{DualFilter, FilterStats};
use crate::insert_log::{DeleteLog, InsertLog};
use crate::policy::HitPolicy;
use crate::pool::{NeighborPool, OBJECT_OVERHEAD_BYTES};

/// Bytes charged per representative beyond its query vector and list.
pub const REP_OVERHEAD_BYTES: usize = 160;
/// Bytes charged per alias (a table slot and a key in its representative).
pub const ALIAS_BYTES: usize = 48;

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
    pub fn is_hit(self) -> bool {
        self != HitKind::Miss
    }
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
}

#[derive(Clone, Debug)]
pub enum Lookup {
    Hit(Hit),
    Miss(MissTicket),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    Admitted(RepId),
    /// The key already has a representative (another miss admitted it first).
    Duplicate(RepId),
    /// Fewer than `k` results survived validation and delete stripping.
    TooFew,
    /// The miss is older than the delete log reaches: it cannot be checked, so it is not admitted.
    Stale,
    /// The entry alone is larger than the whole budget.
    TooLarge,
}

/// A search answered through [`Cache::search`].
#[derive(Clone, Debug)]
pub struct SearchOutcome {
    pub kind: HitKind,
    pub results: Vec<Neighbor>,
    pub exact_distances: bool,
    pub admission: Option<Admission>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeleteOutcome {
    /// The id was in the pool.
    pub cached: bool,
    /// Entries that promoted a reserve result and stay valid.
    pub repaired: usize,
    /// Entries left with fewer than `k` results, removed.
    pub invalidated: usize,
}

/// Why a representative left the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    Evicted,
    Invalidated,
    Replaced,
    LogCap,
}

/// Counters; lookups bump theirs through `&self`.
#[derive(Debug, Default)]
pub struct Counters {
    pub lookups: AtomicU64,
    pub exact_hits: AtomicU64,
    pub alias_hits: AtomicU64,
    pub approximate_hits: AtomicU64,
    pub misses: AtomicU64,
    pub verifications: AtomicU64,
    pub admissions: AtomicU64,
    pub admissions_refused: AtomicU64,
    pub evictions: AtomicU64,
    pub invalidations: AtomicU64,
    pub log_cap_invalidations: AtomicU64,
    pub deletes: AtomicU64,
    pub delete_repairs: AtomicU64,
    pub inserts: AtomicU64,
    pub fast_path_updates: AtomicU64,
    pub slow_path_steps: AtomicU64,
    pub slow_path_merges: AtomicU64,
    pub aliases_linked: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A point-in-time view for STATS and reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheStats {
    pub lookups: u64,
    pub exact_hits: u64,
    pub alias_hits: u64,
    pub approximate_hits: u64,
    pub misses: u64,
    pub verifications: u64,
    pub admissions: u64,
    pub admissions_refused: u64,
    pub evictions: u64,
    pub invalidations: u64,
    pub log_cap_invalidations: u64,
    pub deletes: u64,
    pub delete_repairs: u64,
    pub inserts: u64,
    pub fast_path_updates: u64,
    pub slow_path_steps: u64,
    pub slow_path_merges: u64,
    pub aliases_linked: u64,
    pub representatives: usize,
    pub aliases: usize,
    pub objects: usize,
    pub bytes: usize,
    pub insert_log_len: usize,
    pub risk: f64,
    pub filter: FilterStats,
}

/// Running sums behind the global risk `R` (§4.6).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RiskSums {
    /// Σ r(e) over representatives.
    pub sum_r: f64,
    /// Σ LC over representatives.
    pub sum_cursor: u128,
}

pub struct Cache {
    pub(crate) cfg: CacheConfig,
    pub(crate) policy: Box<dyn HitPolicy>,
    pub(crate) table: ExactTable,
    /// Live representatives; ascending id is admission order, so the first is the FIFO victim.
    pub(crate) reps: BTreeMap<RepId, Representative>,
    pub(crate) pool: NeighborPool,
    pub(crate) filter: DualFilter,
    pub(crate) log: InsertLog,
    pub(crate) deletes: DeleteLog,
    /// (LC, rep): the oldest cursor first, for head trimming and the length cap.
    pub(crate) cursors: BTreeSet<(u64, RepId)>,
    pub(crate) risk: RiskSums,
    pub(crate) next_rep: RepId,
    /// The representative the slow path served last (round-robin position).
    pub(crate) slow_path_last: RepId,
    pub(crate) alias_count: usize,
    /// Bytes of representatives (query, list) and aliases.
    pub(crate) entry_bytes: usize,
    pub(crate) counters: Counters,
}

impl Cache {
    pub fn new(cfg: CacheConfig, policy: Box<dyn HitPolicy>) -> Result<Self> {
        cfg.validate()?;
        Ok(Cache {
            filter: DualFilter::new(cfg.filter, cfg.metric),
            deletes: DeleteLog::new(cfg.delete_log_cap),
            cfg,
            policy,
            table: ExactTable::default(),
            reps: BTreeMap::new(),
            pool: NeighborPool::default(),
            log: InsertLog::default(),
            cursors: BTreeSet::new(),
            risk: RiskSums::default(),
            next_rep: 1,
            slow_path_last: 0,
            alias_count: 0,
            entry_bytes: 0,
            counters: Counters::default(),
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    pub fn policy(&self) -> &dyn HitPolicy {
        self.policy.as_ref()
    }

    /// Results a backend answer should hold for `k`: `k + Δ`.
    pub fn answer_len(&self, k: usize) -> usize {
        k + self.cfg.delta
    }

    pub fn validate_request(&self, q: &[f32], k: usize) -> Result<()> {
        validate_vector(q, self.cfg.dim)?;
        validate_k(k, self.cfg.k_max)
    }

    // ------------------------------------------------------------------ lookup

    /// Algorithm 1. Takes `&self`: it reads, and updates `τ` by compare-and-swap.
    pub fn lookup(&self, q: &[f32], k: usize) -> Result<Lookup> {
        self.validate_request(q, k)?;
        bump(&self.counters.lookups);
        let key = QueryKey::new(q, k);

        if let Some(slot) = self.table.get(&key) {
            let rep = &self.reps[&slot.rep()];
            let kind = match slot {
                Slot::Representative(_) => {
                    self.policy.on_equality_hit(rep);
                    bump(&self.counters.exact_hits);
                    HitKind::Exact
                }
                Slot::Alias(_) => {
                    bump(&self.counters.alias_hits);
                    HitKind::Alias
                }
            };
            return Ok(Lookup::Hit(self.answer(rep, q, k, kind, None)));
        }

        let same_k = |r: RepId| self.reps.get(&r).is_some_and(|e| e.k == k);
        for (rid, d) in self.filter.search(q, self.cfg.filter_candidates, &same_k) {
            let rep = &self.reps[&rid];
            if d < self.policy.threshold(rep) {
                if self.policy.sample_verification() {
                    bump(&self.counters.verifications);
                    bump(&self.counters.misses);
                    let cached = rep.nrl.ids[..k].to_vec();
                    return Ok(Lookup::Miss(self.ticket(q, k, key, Some(cached), false)));
                }
                self.policy.on_approximate_hit(rep);
                bump(&self.counters.approximate_hits);
                let link = self.policy.links_aliases().then_some(key);
                return Ok(Lookup::Hit(self.answer(
                    rep,
                    q,
                    k,
                    HitKind::Approximate,
                    link,
                )));
            }
        }
        bump(&self.counters.misses);
        Ok(Lookup::Miss(self.ticket(q, k, key, None, false)))
    }

    /// A ticket for a miss that skips the lookup: REFRESH (replace the entry) or a
    /// forced miss.
    pub fn miss_ticket(&self, q: &[f32], k: usize, replace: bool) -> Result<MissTicket> {
        self.validate_request(q, k)?;
        Ok(self.ticket(q, k, QueryKey::new(q, k), None, replace))
    }

    fn ticket(
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
            insert_seq: self.log.last_seq(),
            delete_seq: self.deletes.last_seq(),
            verify,
            replace,
        }
    }

    /// The `k` results a hit returns, ascending by distance to the request's vector.
    fn answer(
        &self,
        rep: &Representative,
        q: &[f32],
        k: usize,
        kind: HitKind,
        link: Option<QueryKey>,
    ) -> Hit {
        let nrl: &NeighborList = &rep.nrl;
        debug_assert!(nrl.len() >= k, "a representative holds at least k results");
        let mut results: Vec<Neighbor>;
        let mut exact_distances = true;
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
        Hit {
            kind,
            rep: rep.id,
            results,
            exact_distances,
            link,
        }
    }

    /// Lookup, then whatever it asks of the owner, then the backend on a miss: the
    /// single-threaded composite the experiment runner and tests use.
    pub fn search(&mut self, backend: &dyn Backend, q: &[f32], k: usize) -> Result<SearchOutcome> {
        let outcome = match self.lookup(q, k)? {
            Lookup::Hit(hit) => {
                if let Some(key) = hit.link {
                    self.link_alias(key, hit.rep);
                }
                SearchOutcome {
                    kind: hit.kind,
                    results: hit.results,
                    exact_distances: hit.exact_distances,
                    admission: None,
                }
            }
            Lookup::Miss(ticket) => self.resolve_miss(backend, ticket)?,
        };
        self.run_slow_path();
        Ok(outcome)
    }

    /// Calls the backend for a ticket and admits its answer.
    pub fn resolve_miss(
        &mut self,
        backend: &dyn Backend,
        ticket: MissTicket,
    ) -> Result<SearchOutcome> {
        let k = ticket.k;
        let answer = backend.search(&ticket.query, self.answer_len(k))?;
        let results: Vec<Neighbor> = answer
            .iter()
            .take(k)
            .map(|c| Neighbor {
                id: c.id,
                distance: c.distance,
            })
            .collect();
        if let Some(cached) = &ticket.verify {
            let fresh: Vec<u64> = results.iter().map(|n| n.id).collect();
            self.policy.on_verification(cached, &fresh);
        }
        let admission = self.admit(ticket, answer)?;
        Ok(SearchOutcome {
            kind: HitKind::Miss,
            results,
            exact_distances: true,
            admission: Some(admission),
        })
    }

    // --------------------------------------------------------------- owner side

    /// Links `key` as an alias of `rep` (after an approximate hit). Ignored when `rep`
    /// is gone, the key is already present, or `rep` has its maximum of aliases.
    pub fn link_alias(&mut self, key: QueryKey, rep: RepId) -> bool {
        if self.table.get(&key).is_some() {
            return false;
        }
        let Some(r) = self.reps.get_mut(&rep) else {
            return false;
        };
        if r.aliases.len() >= self.cfg.max_aliases_per_rep {
            return false;
        }
        if let Capacity::Bytes(budget) = self.cfg.capacity {
            if self.pool.bytes() + self.entry_bytes + ALIAS_BYTES > budget {
                return false;
            }
        }
        r.aliases.push(key);
        self.table.insert(key, Slot::Alias(rep));
        self.alias_count += 1;
        self.entry_bytes += ALIAS_BYTES;
        bump(&self.counters.aliases_linked);
        true
    }

    /// Admits a miss's backend answer as a new representative (§4.5).
    pub fn admit(&mut self, ticket: MissTicket, answer: Vec<Candidate>) -> Result<Admission> {
        validate_vector(&ticket.query, self.cfg.dim)?;
        validate_k(ticket.k, self.cfg.k_max)?;
        let k = ticket.k;
        let Some(deleted) = self.deletes.deleted_since(ticket.delete_seq) else {
            bump(&self.counters.admissions_refused);
            return Ok(Admission::Stale);
        };
        let mut answer: Vec<Candidate> = answer
            .into_iter()
            .filter(|c| c.distance.is_finite() && !deleted.contains(&c.id))
            .filter(|c| c.vector.as_ref().is_none_or(|v| v.len() == self.cfg.dim))
            .collect();
        sort_candidates(&mut answer);
        let mut seen = std::collections::HashSet::with_capacity(answer.len());
        answer.retain(|c| seen.insert(c.id));
        answer.truncate(self.answer_len(k));
        if answer.len() < k {
            bump(&self.counters.admissions_refused);
            return Ok(Admission::TooFew);
        }

        match self.table.get(&ticket.key) {
            Some(Slot::Representative(r)) if !ticket.replace => return Ok(Admission::Duplicate(r)),
            Some(Slot::Representative(r)) => self.remove_rep(r, Removal::Replaced),
            Some(Slot::Alias(r)) => self.unlink_alias(ticket.key, r),
            None => {}
        }

        let n = answer.len();
        while !self.fits(n) {
            let Some((&victim, _)) = self.reps.first_key_value() else {
                break;
            };
            self.remove_rep(victim, Removal::Evicted);
        }
        if !self.fits(n) {
            bump(&self.counters.admissions_refused);
            return Ok(Admission::TooLarge);
        }

        let id = self.next_rep;
        self.next_rep += 1;
        let mut nrl = NeighborList::default();
        for c in answer {
            let v = if self.cfg.store_vectors {
                c.vector
            } else {
                None
            };
            self.pool.acquire(c.id, id, v.clone(), None);
            nrl.ids.push(c.id);
            nrl.dists.push(c.distance);
            nrl.vectors.push(v);
        }
        // The backend already reflects every insert the log held when the miss began;
        // a trimmed-away stretch cannot be scanned any more (P2 allows missing it).
        let cursor = ticket
            .insert_seq
            .max(self.log.head_seq() - 1)
            .min(self.log.last_seq());
        let rep = Representative {
            id,
            key: ticket.key,
            k,
            query: ticket.query.clone(),
            tau: AtomicF32::new(self.policy.initial_tau(nrl.min_d())),
            cursor,
            aliases: Vec::new(),
            nrl: Arc::new(nrl),
        };
        self.risk.sum_r += rep.nrl.risk_factor(k);
        self.risk.sum_cursor += cursor as u128;
        self.cursors.insert((cursor, id));
        self.entry_bytes += self.rep_bytes(k);
        self.table.insert(ticket.key, Slot::Representative(id));
        self.filter.insert(id, ticket.query);
        self.reps.insert(id, rep);
        bump(&self.counters.admissions);
        Ok(Admission::Admitted(id))
    }

    fn rep_bytes(&self, k: usize) -> usize {
        REP_OVERHEAD_BYTES + self.cfg.dim * 4 + self.answer_len(k) * 20
    }

    /// Evicts (FIFO) while the pool is over its budget.
    pub(crate) fn evict_to_budget(&mut self) {
        while !self.fits(0) && self.evict_oldest() {}
    }

    /// Whether an entry of `n` results fits without eviction (`n = 0`: within budget).
    fn fits(&self, n: usize) -> bool {
        match self.cfg.capacity {
            Capacity::Objects(cap) => self.pool.len() + n <= cap,
            Capacity::Bytes(budget) => {
                let per_object = OBJECT_OVERHEAD_BYTES
                    + if self.cfg.store_vectors {
                        self.cfg.dim * 4
                    } else {
                        0
                    };
                let extra = if n == 0 {
                    0
                } else {
                    n * per_object + REP_OVERHEAD_BYTES + self.cfg.dim * 4 + n * 20
                };
                self.bytes() + extra <= budget
            }
        }
    }

    fn unlink_alias(&mut self, key: QueryKey, rep: RepId) {
        self.table.remove(&key);
        if let Some(r) = self.reps.get_mut(&rep) {
            r.aliases.retain(|a| *a != key);
        }
        self.alias_count -= 1;
        self.entry_bytes -= ALIAS_BYTES;
    }

    /// Removes a representative with its aliases: releases its references, tombstones it
    /// in the filter, and trims the insert log to the oldest cursor left.
    pub(crate) fn remove_rep(&mut self, id: RepId, why: Removal) {
        let Some(rep) = self.reps.remove(&id) else {
            return;
        };
        for &nid in &rep.nrl.ids {
            self.pool.release(nid, id);
        }
        if self.table.get(&rep.key) == Some(Slot::Representative(id)) {
            self.table.remove(&rep.key);
        }
        for a in &rep.aliases {
            if self.table.get(a) == Some(Slot::Alias(id)) {
                self.table.remove(a);
            }
        }
        self.alias_count -= rep.aliases.len();
        self.entry_bytes -= rep.aliases.len() * ALIAS_BYTES + self.rep_bytes(rep.k);
        self.filter.remove(id);
        self.cursors.remove(&(rep.cursor, id));
        self.risk.sum_r -= rep.nrl.risk_factor(rep.k);
        self.risk.sum_cursor -= rep.cursor as u128;
        if self.reps.is_empty() {
            self.risk = RiskSums::default();
        }
        match why {
            Removal::Evicted => bump(&self.counters.evictions),
            Removal::Invalidated | Removal::Replaced => bump(&self.counters.invalidations),
            Removal::LogCap => bump(&self.counters.log_cap_invalidations),
        }
        self.trim_log();
    }

    /// Evicts the oldest representative (FIFO). False when empty.
    pub fn evict_oldest(&mut self) -> bool {
        match self.reps.first_key_value() {
            Some((&id, _)) => {
                self.remove_rep(id, Removal::Evicted);
                true
            }
            None => false,
        }
    }

    /// Drops log records every representative has accounted for.
    pub(crate) fn trim_log(&mut self) {
        let upto = self
            .cursors
            .first()
            .map_or(self.log.last_seq(), |&(c, _)| c);
        self.log.trim_to(upto);
    }

    /// Replaces `rep`'s list, keeping the risk sums current.
    pub(crate) fn set_nrl(&mut self, id: RepId, nrl: NeighborList) {
        let rep = self
            .reps
            .get_mut(&id)
            .expect("set_nrl on a live representative");
        debug_assert!(nrl.is_sorted());
        self.risk.sum_r += nrl.risk_factor(rep.k) - rep.nrl.risk_factor(rep.k);
        rep.nrl = Arc::new(nrl);
    }

    /// DELETE (§4.6): the id leaves the pool at once; every entry listing it promotes
    /// its next reserve; an entry left with fewer than `k` results is invalidated.
    pub fn delete(&mut self, id: u64) -> DeleteOutcome {
        bump(&self.counters.deletes);
        self.deletes.append(id);
        self.log.tombstone(id);
        let mut out = DeleteOutcome::default();
        let Some(holders) = self.pool.remove(id) else {
            return out;
        };
        out.cached = true;
        for rid in holders {
            let Some(rep) = self.reps.get(&rid) else {
                continue;
            };
            let mut nrl = (*rep.nrl).clone();
            let k = rep.k;
            if let Some(i) = nrl.position(id) {
                nrl.remove_at(i);
            }
            let short = nrl.len() < k;
            self.set_nrl(rid, nrl);
            if short {
                self.remove_rep(rid, Removal::Invalidated);
                out.invalidated += 1;
            } else {
                bump(&self.counters.delete_repairs);
                out.repaired += 1;
            }
        }
        out
    }

    /// FLUSH: drops every entry (the logs' sequence numbers carry on).
    pub fn flush(&mut self) {
        let ids: Vec<RepId> = self.reps.keys().copied().collect();
        for id in ids {
            self.remove_rep(id, Removal::Invalidated);
        }
        debug_assert!(self.pool.is_empty() && self.table.is_empty());
        self.filter.clear();
    }

    // ------------------------------------------------------------------ reading

    pub fn len(&self) -> usize {
        self.reps.len()
    }
    pub fn is_empty(&self) -> bool {
        self.reps.is_empty()
    }
    pub fn objects(&self) -> usize {
        self.pool.len()
    }
    pub fn aliases(&self) -> usize {
        self.alias_count
    }
    /// Estimated bytes held: objects, representatives, aliases.
    pub fn bytes(&self) -> usize {
        self.pool.bytes() + self.entry_bytes
    }
    pub fn representative(&self, id: RepId) -> Option<&Representative> {
        self.reps.get(&id)
    }
    pub fn representatives(&self) -> impl Iterator<Item = &Representative> {
        self.reps.values()
    }
    pub fn slot(&self, q: &[f32], k: usize) -> Option<Slot> {
        self.table.get(&QueryKey::new(q, k))
    }
    pub fn insert_log_len(&self) -> usize {
        self.log.len()
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheStats {
            lookups: g(&c.lookups),
            exact_hits: g(&c.exact_hits),
            alias_hits: g(&c.alias_hits),
            approximate_hits: g(&c.approximate_hits),
            misses: g(&c.misses),
            verifications: g(&c.verifications),
            admissions: g(&c.admissions),
            admissions_refused: g(&c.admissions_refused),
            evictions: g(&c.evictions),
            invalidations: g(&c.invalidations),
            log_cap_invalidations: g(&c.log_cap_invalidations),
            deletes: g(&c.deletes),
            delete_repairs: g(&c.delete_repairs),
            inserts: g(&c.inserts),
            fast_path_updates: g(&c.fast_path_updates),
            slow_path_steps: g(&c.slow_path_steps),
            slow_path_merges: g(&c.slow_path_merges),
            aliases_linked: g(&c.aliases_linked),
            representatives: self.reps.len(),
            aliases: self.alias_count,
            objects: self.pool.len(),
            bytes: self.bytes(),
            insert_log_len: self.log.len(),
            risk: self.risk(),
            filter: self.filter.stats(),
        }
    }

    /// Every structural invariant, checked from scratch (tests, debug tooling).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut aliases = 0;
        let mut sum_cursor: u128 = 0;
        for (&id, rep) in &self.reps {
            let nrl = &rep.nrl;
            let ctx = |m: &str| format!("rep {id}: {m}");
            if rep.id != id {
                return Err(ctx("id mismatch"));
            }
            if nrl.len() < rep.k || nrl.len() > self.answer_len(rep.k) {
                return Err(ctx(&format!(
                    "list length {} outside k..=k+Δ ({})",
                    nrl.len(),
                    rep.k
                )));
            }
            if nrl.ids.len() != nrl.dists.len() || nrl.ids.len() != nrl.vectors.len() {
                return Err(ctx("list columns differ in length"));
            }
            if !nrl.is_sorted() {
                return Err(ctx("list not ascending"));
            }
            for &nid in &nrl.ids {
                match self.pool.get(nid) {
                    Some(o) if o.holders.contains(&id) => {}
                    _ => return Err(ctx(&format!("id {nid} has no object held by it"))),
                }
            }
            if self.table.get(&rep.key) != Some(Slot::Representative(id)) {
                return Err(ctx("key not in the exact table"));
            }
            for a in &rep.aliases {
                if self.table.get(a) != Some(Slot::Alias(id)) {
                    return Err(ctx("alias not in the exact table"));
                }
            }
            aliases += rep.aliases.len();
            if !self.filter.contains(id) {
                return Err(ctx("not in the query filter"));
            }
            if !self.cursors.contains(&(rep.cursor, id)) {
                return Err(ctx("cursor not indexed"));
            }
            if rep.cursor > self.log.last_seq() || rep.cursor + 1 < self.log.head_seq() {
                return Err(ctx(&format!(
                    "cursor {} outside the log [{}, {}]",
                    rep.cursor,
                    self.log.head_seq(),
                    self.log.last_seq()
                )));
            }
            sum_cursor += rep.cursor as u128;
        }
        for (&nid, obj) in self.pool.iter() {
            if obj.holders.is_empty() {
                return Err(format!("object {nid} has no references"));
            }
            for h in &obj.holders {
                if !self.reps.get(h).is_some_and(|r| r.nrl.ids.contains(&nid)) {
                    return Err(format!(
                        "object {nid} names holder {h} that does not list it"
                    ));
                }
            }
        }
        if aliases != self.alias_count || self.table.len() != self.reps.len() + aliases {
            return Err(format!(
                "table holds {} keys for {} reps + {} aliases",
                self.table.len(),
                self.reps.len(),
                aliases
            ));
        }
        if self.filter.live() != self.reps.len() {
            return Err(format!(
                "filter has {} live for {} reps",
                self.filter.live(),
                self.reps.len()
            ));
        }
        if self.cursors.len() != self.reps.len() || sum_cursor != self.risk.sum_cursor {
            return Err("cursor index or sum out of step".into());
        }
        if let Capacity::Objects(cap) = self.cfg.capacity {
            if self.pool.len() > cap {
                return Err(format!("{} objects over capacity {cap}", self.pool.len()));
            }
        }
        if let Capacity::Bytes(b) = self.cfg.capacity {
            if self.bytes() > b {
                return Err(format!("{} bytes over budget {b}", self.bytes()));
            }
        }
        Ok(())
    }
}
