//! The owner of one shard: admission and FIFO eviction (§4.5, §4.7), deletes (§4.6),
//! alias links, FLUSH. Inserts and refresh live in `refresh.rs`, lookups in `read.rs`.
//!
//! ```text
//!   any core ── lookup ──► CacheReader (shared, lock-free)   ◄── publishes ──┐
//!                 │ hit: alias link / slow-path credit (channel, owner side)  │
//!                 │ miss: backend, then admit ──────────────────────────────► Cache (owner)
//!   INSERT / DELETE ───────────────────────────────────────────────────────► Cache (owner)
//! ```
//!
//! The owner keeps private bookkeeping (pool, logs, cursors, FIFO) and publishes what
//! readers need: the exact table, one immutable view per representative, the filter
//! set, and the log sequence numbers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::backend::{sort_candidates, Backend, Candidate};
use crate::budget::GlobalBudget;
use crate::config::{CacheConfig, Capacity, Eviction};
use crate::entry::{EntryState, NeighborList, RepId, RepView, Representative};
use crate::error::{validate_k, validate_vector, Result};
use crate::exact_table::{QueryKey, Slot};
use crate::filter::{DualFilter, FilterStats, InsertSeeds};
use crate::gap::{self, Gauge};
use crate::hash::{HashMap, HashSet, SharedMap};
use crate::insert_log::{DeleteLog, InsertLog};
use crate::policy::HitPolicy;
use crate::pool::{NeighborPool, OBJECT_OVERHEAD_BYTES};
use crate::reach::MaxDistances;
use crate::read::{CacheReader, Counters, HitKind, Lookup, MissTicket, Neighbor};
use crate::recent::RecentInserts;

/// A pinned view of one of the maps readers probe, as `check_invariants` reads it.
type PinnedMap<'a, K, V> =
    papaya::HashMapRef<'a, K, V, crate::hash::RandomState, papaya::LocalGuard<'a>>;

/// Bytes charged per representative beyond its query vector and list.
pub(crate) const REP_OVERHEAD_BYTES: usize = 160;
/// Bytes charged per alias (a table slot and a key in its representative).
pub(crate) const ALIAS_BYTES: usize = 48;

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
pub(crate) enum Removal {
    Evicted,
    Invalidated,
    Replaced,
    LogCap,
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
    pub catch_ups: u64,
    pub hits_with_recent: u64,
    pub hits_behind: u64,
    pub aliases_linked: u64,
    pub alias_promotions: u64,
    pub representatives: usize,
    pub aliases: usize,
    pub objects: usize,
    pub bytes: usize,
    pub insert_log_len: usize,
    pub risk: f64,
    pub filter: FilterStats,
}

impl CacheStats {
    /// Adds `o` into `self` (sums; risk is averaged by the caller if needed).
    pub fn accumulate(&mut self, o: &CacheStats) {
        macro_rules! add {
            ($($f:ident),*) => { $( self.$f += o.$f; )* };
        }
        add!(
            lookups,
            exact_hits,
            alias_hits,
            approximate_hits,
            misses,
            verifications,
            admissions,
            admissions_refused,
            evictions,
            invalidations,
            log_cap_invalidations,
            deletes,
            delete_repairs,
            inserts,
            fast_path_updates,
            slow_path_steps,
            slow_path_merges,
            catch_ups,
            hits_with_recent,
            hits_behind,
            aliases_linked,
            alias_promotions,
            representatives,
            aliases,
            objects,
            bytes,
            insert_log_len
        );
        self.risk = self.risk.max(o.risk);
        self.filter.live += o.filter.live;
        self.filter.tombstones += o.filter.tombstones;
        self.filter.rotations += o.filter.rotations;
        self.filter.reinserted_on_rotation += o.filter.reinserted_on_rotation;
        self.filter.standby_live += o.filter.standby_live;
        self.filter.standby_moved += o.filter.standby_moved;
        self.filter.draining += o.filter.draining;
    }
}

/// Running sums behind the global risk `R` (§4.6).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RiskSums {
    /// Σ r(e) over representatives, in fixed point (see `NeighborList::risk_fixed`).
    pub sum_r: u64,
    /// Σ LC over representatives.
    pub sum_cursor: u128,
}

/// A representative about to be installed (`Cache::install`): an admitted answer, or
/// one restored from a snapshot (`snapshot.rs`).
pub(crate) struct NewEntry {
    pub key: QueryKey,
    pub k: usize,
    pub query: Arc<[f32]>,
    /// `k..=k + Δ` results, ascending, validated.
    pub answer: Vec<Candidate>,
    pub tau: f32,
    pub min_gap: f32,
    /// `LC`.
    pub cursor: u64,
    pub referenced: bool,
}

pub struct Cache {
    pub(crate) read: Arc<CacheReader>,
    pub(crate) cfg: CacheConfig,
    pub(crate) policy: Arc<dyn HitPolicy>,
    /// Live representatives; ascending id is admission order, so the first is the FIFO victim.
    pub(crate) reps: BTreeMap<RepId, Representative>,
    pub(crate) pool: NeighborPool,
    pub(crate) filter: DualFilter,
    pub(crate) log: InsertLog,
    pub(crate) deletes: DeleteLog,
    /// (LC, rep): the oldest cursor first, for head trimming and the length cap.
    pub(crate) cursors: BTreeSet<(u64, RepId)>,
    pub(crate) risk: RiskSums,
    /// Every live list's `maxD` in the filter's unit (`Gauge::filter_max_d`): the
    /// insert fast path's reach (`reach.rs`).
    pub(crate) max_ds: MaxDistances,
    /// Each live representative's `maxD` in the filter's unit, for the insert fast path's "does it take the
    /// vector?" asked of every candidate its filter search offers: one hash probe where
    /// `reps` (a B-tree of 100,000 entries, then the list behind two pointers) cost
    /// several dependent cache misses.
    pub(crate) max_d_by_rep: HashMap<RepId, f32>,
    pub(crate) next_rep: RepId,
    /// The representative the slow path served last (round-robin position).
    pub(crate) slow_path_last: RepId,
    /// The second-chance clock's hand: the id it looks at next (`Eviction::SecondChance`).
    pub(crate) clock_hand: RepId,
    pub(crate) alias_count: usize,
    /// Bytes of representatives (query, list) and aliases.
    pub(crate) entry_bytes: usize,
    /// A share of a global budget instead of `cfg.capacity`'s amount.
    pub(crate) budget: Option<(Arc<GlobalBudget>, usize)>,
}

impl Cache {
    pub fn new(cfg: CacheConfig, policy: Box<dyn HitPolicy>) -> Result<Self> {
        cfg.validate()?;
        let policy: Arc<dyn HitPolicy> = Arc::from(policy);
        let filter =
            DualFilter::with_standby_search(cfg.filter, cfg.metric, cfg.dim, cfg.standby_search);
        // No larger than the log's cap: the log must hold every record the ring does, for
        // a delete to find it and an owner to catch an entry up.
        let ring = cfg.hit_check_records_max.min(cfg.insert_log_records_max());
        let recent = Arc::new(RecentInserts::new(ring));
        let read = Arc::new(CacheReader {
            cfg: cfg.clone(),
            policy: policy.clone(),
            table: SharedMap::default(),
            reps: SharedMap::default(),
            filter: filter.published(),
            insert_seq: AtomicU64::new(0),
            delete_seq: AtomicU64::new(0),
            recent: recent.clone(),
            counters: Counters::default(),
            credit_pending: Default::default(),
            threshold_scale: std::sync::atomic::AtomicU32::new(1.0f32.to_bits()),
        });
        Ok(Cache {
            read,
            deletes: DeleteLog::new(cfg.delete_log_cap),
            filter,
            cfg,
            policy,
            reps: BTreeMap::new(),
            pool: NeighborPool::default(),
            log: InsertLog::new(recent),
            cursors: BTreeSet::new(),
            risk: RiskSums::default(),
            max_ds: MaxDistances::default(),
            max_d_by_rep: HashMap::default(),
            next_rep: 1,
            slow_path_last: 0,
            clock_hand: 0,
            alias_count: 0,
            entry_bytes: 0,
            budget: None,
        })
    }

    /// A shard whose capacity is its share of `budget` (in `cfg.capacity`'s unit).
    pub fn with_budget(
        cfg: CacheConfig,
        policy: Box<dyn HitPolicy>,
        budget: Arc<GlobalBudget>,
        shard: usize,
    ) -> Result<Self> {
        let mut c = Cache::new(cfg, policy)?;
        c.budget = Some((budget, shard));
        Ok(c)
    }

    /// The amount the pool may hold now.
    fn capacity_now(&self) -> usize {
        match (&self.budget, self.cfg.capacity) {
            (Some((b, s)), _) => b.share(*s),
            (None, Capacity::Objects(n) | Capacity::Bytes(n)) => n,
        }
    }

    /// The read side, for other threads.
    pub fn reader(&self) -> Arc<CacheReader> {
        self.read.clone()
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

    /// Algorithm 1, on the read side.
    pub fn lookup(&self, q: &[f32], k: usize) -> Result<Lookup> {
        self.read.lookup(q, k)
    }

    pub fn miss_ticket(&self, q: &[f32], k: usize, replace: bool) -> Result<MissTicket> {
        self.read.miss_ticket(q, k, replace)
    }

    /// Lookup, then whatever it asks of the owner, then the backend on a miss: the
    /// single-threaded composite the experiment runner and tests use.
    pub fn search(&mut self, backend: &dyn Backend, q: &[f32], k: usize) -> Result<SearchOutcome> {
        let lookup = self.lookup(q, k)?;
        let outcome = self.complete(backend, lookup)?;
        self.run_slow_path();
        Ok(outcome)
    }

    /// Finishes a lookup on the owner: a hit links its alias, a miss calls the backend
    /// and admits the answer.
    pub fn complete(&mut self, backend: &dyn Backend, lookup: Lookup) -> Result<SearchOutcome> {
        match lookup {
            Lookup::Hit(hit) => {
                if let Some(key) = hit.link {
                    self.link_alias(key, hit.rep);
                }
                if let Some(rep) = hit.catch_up {
                    self.catch_up(rep);
                }
                Ok(SearchOutcome {
                    kind: hit.kind,
                    results: hit.results,
                    exact_distances: hit.exact_distances,
                    admission: None,
                })
            }
            Lookup::Miss(ticket) => self.resolve_miss(backend, ticket),
        }
    }

    /// Calls the backend for a ticket and admits its answer.
    pub fn resolve_miss(
        &mut self,
        backend: &dyn Backend,
        ticket: MissTicket,
    ) -> Result<SearchOutcome> {
        let k = ticket.k;
        if let Some(rep) = ticket.catch_up {
            self.catch_up(rep);
        }
        let answer = backend.search(&ticket.query, self.answer_len(k))?;
        let results: Vec<Neighbor> = answer
            .iter()
            .take(k)
            .map(|c| Neighbor {
                id: c.id,
                distance: c.distance,
            })
            .collect();
        let admission = self.admit(ticket, answer)?;
        Ok(SearchOutcome {
            kind: HitKind::Miss,
            results,
            exact_distances: true,
            admission: Some(admission),
        })
    }

    // ------------------------------------------------------------ publication

    pub(crate) fn publish_view(&self, view: RepView) {
        self.read.reps.pin().insert(view.id, view);
    }

    pub(crate) fn publish_seqs(&self) {
        self.read
            .insert_seq
            .store(self.log.last_seq(), Ordering::Release);
        self.read
            .delete_seq
            .store(self.deletes.last_seq(), Ordering::Release);
    }

    // --------------------------------------------------------------- owner side

    /// Links `key` as an alias of `rep` (after an approximate hit). Ignored when `rep`
    /// is gone, the key is already present, or `rep` has its maximum of aliases: so
    /// duplicate link requests from several cores are harmless.
    pub fn link_alias(&mut self, key: QueryKey, rep: RepId) -> bool {
        let table = self.read.table.pin();
        if table.get(&key).is_some() {
            return false;
        }
        if matches!(self.cfg.capacity, Capacity::Bytes(_))
            && self.bytes() + ALIAS_BYTES > self.capacity_now()
        {
            return false;
        }
        let Some(r) = self.reps.get_mut(&rep) else {
            return false;
        };
        if r.aliases.len() >= self.cfg.max_aliases_per_rep {
            return false;
        }
        r.aliases.push(key);
        table.insert(key, Slot::Alias(rep));
        self.alias_count += 1;
        self.entry_bytes += ALIAS_BYTES;
        self.read.counters.aliases_linked.bump();
        true
    }

    /// Admits a miss's backend answer as a new representative (§4.5).
    pub fn admit(&mut self, ticket: MissTicket, answer: Vec<Candidate>) -> Result<Admission> {
        validate_vector(&ticket.query, self.cfg.dim)?;
        validate_k(ticket.k, self.cfg.k_max)?;
        let k = ticket.k;
        // A sampled verification (Potluck+) learns from the backend's own top-k, on
        // whichever core the miss ran: the answer reaches the owner either way.
        if let Some(cached) = &ticket.verify {
            let fresh: Vec<u64> = answer.iter().take(k).map(|c| c.id).collect();
            self.policy.on_verification(cached, &fresh);
        }
        // A promoted alias (the guarded policy) gives way whether or not the answer is
        // admitted: left in place it would turn every repeat into a backend call.
        if self.policy.promotes_aliases() {
            let slot = self.read.table.pin().get(&ticket.key).copied();
            if let Some(Slot::Alias(r)) = slot {
                self.unlink_alias(ticket.key, r);
            }
        }
        let Some(deleted) = self.deletes.deleted_since(ticket.delete_seq) else {
            self.read.counters.admissions_refused.bump();
            return Ok(Admission::Stale);
        };
        // The answer may predate every insert after the ticket: its entry's cursor starts
        // there, and records the log no longer holds could not be checked.
        if ticket.insert_seq + 1 < self.log.head_seq() {
            self.read.counters.admissions_refused.bump();
            return Ok(Admission::Stale);
        }
        // A replacement never shrinks an entry: it keeps the larger k (REFRESH_ENTRY or a
        // recall repair asked at a smaller k), and an answer too short for it is TooFew
        // (the entry stays as it is).
        let existing = self.read.table.pin().get(&ticket.key).copied();
        let k = match existing {
            Some(Slot::Representative(r)) if ticket.replace => {
                self.reps.get(&r).map_or(k, |held| k.max(held.k))
            }
            _ => k,
        };
        let mut answer: Vec<Candidate> = answer
            .into_iter()
            .filter(|c| c.distance.is_finite() && !deleted.contains(&c.id))
            .filter(|c| c.vector.as_ref().is_none_or(|v| v.len() == self.cfg.dim))
            .collect();
        sort_candidates(&mut answer);
        let mut seen = HashSet::with_capacity_and_hasher(answer.len(), Default::default());
        answer.retain(|c| seen.insert(c.id));
        answer.truncate(self.answer_len(k));
        if answer.len() < k {
            self.read.counters.admissions_refused.bump();
            return Ok(Admission::TooFew);
        }

        match existing {
            Some(Slot::Representative(r)) if !ticket.replace => return Ok(Admission::Duplicate(r)),
            Some(Slot::Representative(r)) => self.remove_rep(r, Removal::Replaced),
            Some(Slot::Alias(r)) => self.unlink_alias(ticket.key, r),
            None => {}
        }

        let n = answer.len();
        // The share may have shrunk since the last admission.
        self.evict_to_budget();
        while !self.fits(n) {
            if !self.evict_one() {
                break;
            }
        }
        if !self.fits(n) {
            self.read.counters.admissions_refused.bump();
            return Ok(Admission::TooLarge);
        }

        let gauge = self.gauge();
        // ip's minD is an angle: it needs the results' vectors, kept or not.
        let (min_gap, kth_gap) = gauge.answer_gaps(
            &ticket.query,
            k,
            answer.iter().map(|c| (c.distance, c.vector.as_deref())),
        );
        // The backend already reflects every insert the log held when the miss began
        // (the log still holds every record after it: checked above); hits check the rest.
        let cursor = ticket.insert_seq.min(self.log.last_seq());
        let tau = self
            .policy
            .initial_tau(min_gap.unwrap_or(0.0), kth_gap.map(|g| (k, g)));
        let entry = NewEntry {
            key: ticket.key,
            k,
            query: ticket.query.clone(),
            answer,
            tau,
            min_gap: min_gap.unwrap_or(0.0),
            cursor,
            referenced: false,
        };
        let id = self.install(entry, &ticket.seeds);
        self.read.counters.admissions.bump();
        if let Some((b, s)) = &self.budget {
            b.record_admission(*s);
        }
        Ok(Admission::Admitted(id))
    }

    /// Makes `e` a representative: its objects, view, key, filter point and the sums
    /// that follow every list. The caller has made room (`fits`) and validated `e`.
    pub(crate) fn install(&mut self, e: NewEntry, seeds: &InsertSeeds) -> RepId {
        let id = self.next_rep;
        self.next_rep += 1;
        self.pool.warm(e.answer.iter().map(|c| c.id));
        let gauge = self.gauge();
        let query_norm = gap::norm(&e.query);
        let mut nrl = NeighborList::default();
        for c in e.answer {
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
        let view = RepView {
            id,
            k: e.k,
            query: e.query.clone(),
            state: Arc::new(EntryState::new(e.tau, e.referenced)),
            query_norm,
            min_gap: e.min_gap,
            cursor: e.cursor,
            nrl: Arc::new(nrl),
        };
        self.risk.sum_r += view.nrl.risk_fixed(e.k, gauge, query_norm);
        let max_d = gauge.filter_max_d(view.nrl.max_d(), query_norm);
        self.max_ds.add(max_d);
        self.max_d_by_rep.insert(id, max_d);
        self.risk.sum_cursor += e.cursor as u128;
        self.cursors.insert((e.cursor, id));
        self.entry_bytes += self.rep_bytes(e.k);
        // Publish the view before the key and the filter point, so a reader that finds
        // either always finds the view.
        self.publish_view(view.clone());
        self.read
            .table
            .pin()
            .insert(e.key, Slot::Representative(id));
        self.filter
            .insert_seeded(id, gauge.filter_point(&e.query), seeds);
        self.reps.insert(
            id,
            Representative {
                view,
                key: e.key,
                aliases: Vec::new(),
            },
        );
        id
    }

    fn rep_bytes(&self, k: usize) -> usize {
        REP_OVERHEAD_BYTES + self.query_bytes() + self.answer_len(k) * 20
    }

    /// A representative's query vector; on `ip` its filter also keeps the unit
    /// direction, a second copy (`gap.rs`).
    fn query_bytes(&self) -> usize {
        let copies = if self.gauge().angular() { 2 } else { 1 };
        copies * self.cfg.dim * 4
    }

    /// Evicts (FIFO) while the pool is over its budget.
    pub(crate) fn evict_to_budget(&mut self) {
        while !self.fits(0) && self.evict_one() {}
    }

    /// Whether an entry of `n` results fits without eviction (`n = 0`: within budget).
    pub(crate) fn fits(&self, n: usize) -> bool {
        let cap = self.capacity_now();
        match self.cfg.capacity {
            Capacity::Objects(_) => self.pool.len() + n <= cap,
            Capacity::Bytes(_) => {
                let per_object = OBJECT_OVERHEAD_BYTES
                    + if self.cfg.store_vectors {
                        self.cfg.dim * 4
                    } else {
                        0
                    };
                let extra = if n == 0 {
                    0
                } else {
                    n * per_object + REP_OVERHEAD_BYTES + self.query_bytes() + n * 20
                };
                self.bytes() + extra <= cap
            }
        }
    }

    fn unlink_alias(&mut self, key: QueryKey, rep: RepId) {
        self.read.table.pin().remove(&key);
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
        self.pool.warm(rep.nrl.ids.iter().copied());
        // Unpublish first: readers stop finding it before its objects go.
        {
            let table = self.read.table.pin();
            if table.get(&rep.key) == Some(&Slot::Representative(id)) {
                table.remove(&rep.key);
            }
            for a in &rep.aliases {
                if table.get(a) == Some(&Slot::Alias(id)) {
                    table.remove(a);
                }
            }
        }
        self.read.reps.pin().remove(&id);
        self.filter.remove(id);
        for &nid in &rep.nrl.ids {
            self.pool.release(nid, id);
        }
        self.alias_count -= rep.aliases.len();
        self.entry_bytes -= rep.aliases.len() * ALIAS_BYTES + self.rep_bytes(rep.k);
        self.cursors.remove(&(rep.cursor, id));
        self.risk.sum_r -= rep.nrl.risk_fixed(rep.k, self.gauge(), rep.query_norm);
        self.risk.sum_cursor -= rep.cursor as u128;
        let max_d = self
            .max_d_by_rep
            .remove(&id)
            .expect("every representative has its maxD");
        self.max_ds.remove(max_d);
        if self.reps.is_empty() {
            self.risk = RiskSums::default();
            debug_assert!(self.max_ds.is_empty());
        }
        let c = &self.read.counters;
        match why {
            Removal::Evicted => c.evictions.bump(),
            Removal::Invalidated | Removal::Replaced => c.invalidations.bump(),
            Removal::LogCap => c.log_cap_invalidations.bump(),
        }
        self.trim_log();
    }

    /// Evicts one representative by the configured rule (`Eviction`). False when empty.
    pub fn evict_one(&mut self) -> bool {
        let victim = match self.cfg.eviction {
            Eviction::Fifo => self.reps.first_key_value().map(|(&id, _)| id),
            Eviction::SecondChance => self.clock_victim(),
        };
        match victim {
            Some(id) => {
                self.remove_rep(id, Removal::Evicted);
                true
            }
            None => false,
        }
    }

    /// CLOCK over admission order from the hand: the first entry not hit since the hand
    /// last passed it (each one passed loses its mark). One full pass clears every
    /// mark, so at most `n + 1` entries are looked at.
    fn clock_victim(&mut self) -> Option<RepId> {
        let n = self.reps.len();
        let hand = self.clock_hand;
        let order = self.reps.range(hand..).chain(self.reps.range(..hand));
        let unmarked = order
            .clone()
            .cycle()
            .take(n + 1)
            .find(|(_, r)| !r.state.referenced.swap(false, Ordering::Relaxed))
            .map(|(&id, _)| id);
        // Readers may mark entries again while the hand passes (akerd's lookups run
        // beside the owner): after a full pass the entry at the hand leaves regardless.
        let victim = unmarked.or_else(|| order.map(|(&id, _)| id).next())?;
        self.clock_hand = victim + 1;
        Some(victim)
    }

    /// Evicts the oldest representative (FIFO), whatever the rule. False when empty.
    pub fn evict_oldest(&mut self) -> bool {
        match self.reps.first_key_value() {
            Some((&id, _)) => {
                self.remove_rep(id, Removal::Evicted);
                true
            }
            None => false,
        }
    }

    /// Drops log records every representative has accounted for, but for the newest
    /// `hit_check_records_max`: an entry admitted from a miss's ticket taken before them
    /// gets its cursor at the ticket, and the owner must be able to catch it up.
    pub(crate) fn trim_log(&mut self) {
        let last = self.log.last_seq();
        let upto = self
            .cursors
            .first()
            .map_or(last, |&(c, _)| c)
            .min(last.saturating_sub(self.log.window()));
        self.log.trim_to(upto);
    }

    /// `W`: records some entry has not accounted for, from the oldest cursor (the log
    /// itself keeps the newest `hit_check_records_max` beyond that: `trim_log`).
    pub(crate) fn log_span(&self) -> u64 {
        self.cursors
            .first()
            .map_or(0, |&(c, _)| self.log.last_seq() - c)
    }

    /// The thresholds' unit and the filter's view of vectors for this cache's metric.
    pub(crate) fn gauge(&self) -> Gauge {
        Gauge(self.cfg.metric)
    }

    /// Replaces `rep`'s list and publishes it, keeping the risk sums, `maxD`s and
    /// `minD` current. `merged`: the result a merge added (distance, vector). On `ip`
    /// with vectors kept, `minD` is recomputed over the list; without them it can only
    /// fall to the merged result's angle, and a delete keeps it (the smallest angle
    /// only grows when a result leaves: what is kept is tighter than the truth).
    pub(crate) fn set_nrl(&mut self, id: RepId, nrl: NeighborList, merged: Option<(f32, &[f32])>) {
        let gauge = self.gauge();
        let rep = self
            .reps
            .get_mut(&id)
            .expect("set_nrl on a live representative");
        debug_assert!(nrl.is_sorted());
        let n = rep.query_norm;
        self.risk.sum_r =
            self.risk.sum_r + nrl.risk_fixed(rep.k, gauge, n) - rep.nrl.risk_fixed(rep.k, gauge, n);
        let max_d = gauge.filter_max_d(nrl.max_d(), rep.query_norm);
        let old = self.max_d_by_rep.insert(id, max_d);
        self.max_ds
            .replace(old.expect("every representative has its maxD"), max_d);
        let listed = nrl.dists.iter().zip(&nrl.vectors);
        let min_gap = if !gauge.angular() || self.cfg.store_vectors {
            gauge.min_gap(&rep.query, listed.map(|(&d, v)| (d, v.as_deref())))
        } else {
            let merged = merged.map(|(d, v)| (d, Some(v)));
            let known = gauge.min_gap(&rep.query, merged);
            known.map(|g| g.min(rep.view.min_gap))
        };
        if let Some(g) = min_gap {
            rep.view.min_gap = g;
        }
        rep.view.nrl = Arc::new(nrl);
        let view = rep.view.clone();
        self.publish_view(view);
    }

    /// DELETE (§4.6): the id leaves the pool at once; every entry listing it promotes
    /// its next reserve; an entry left with fewer than `k` results is invalidated.
    /// Call after the backend applied the delete; once this returns, no lookup that
    /// starts afterwards can return `id`.
    pub fn delete(&mut self, id: u64) -> DeleteOutcome {
        self.read.counters.deletes.bump();
        self.deletes.append(id);
        self.log.tombstone(id);
        let mut out = DeleteOutcome::default();
        if let Some(holders) = self.pool.remove(id) {
            out.cached = true;
            for rid in holders {
                let Some(rep) = self.reps.get(&rid) else {
                    continue;
                };
                let k = rep.k;
                let mut nrl = (*rep.nrl).clone();
                if let Some(i) = nrl.position(id) {
                    nrl.remove_at(i);
                }
                // Without refresh no reserve is promoted: the entry goes.
                if nrl.len() < k || !self.cfg.refresh {
                    // Unpublish without publishing the short list first; its other
                    // references are released by remove_rep (the deleted one is gone).
                    let gauge = self.gauge();
                    let rep = self.reps.get_mut(&rid).expect("live");
                    let n = rep.query_norm;
                    self.risk.sum_r = self.risk.sum_r + nrl.risk_fixed(k, gauge, n)
                        - rep.nrl.risk_fixed(k, gauge, n);
                    rep.view.nrl = Arc::new(nrl);
                    self.remove_rep(rid, Removal::Invalidated);
                    out.invalidated += 1;
                } else {
                    self.set_nrl(rid, nrl, None);
                    self.read.counters.delete_repairs.bump();
                    out.repaired += 1;
                }
            }
        }
        self.publish_seqs();
        out
    }

    /// Upkeep for idle owner time: re-inserts up to `max` survivors of a dropped filter
    /// generation (each filter write also moves one), then entries of the standby
    /// generation, so that lookups search one generation again sooner
    /// (`DualFilter::maintain`). Returns how many moved; 0 when nothing is pending.
    /// Then, with none pending, up to `max` slow-path batches for the entries furthest
    /// behind the insert log, while one is more than half the hit check's window behind:
    /// caught up here, its next hit neither scans much nor misses (`recent.rs`).
    pub fn maintain(&mut self, max: usize) -> usize {
        let moved = self.filter.maintain(max);
        if moved > 0 {
            return moved;
        }
        let last = self.log.last_seq();
        let behind = last.saturating_sub(self.log.window() / 2);
        let mut steps = 0;
        while steps < max {
            match self.cursors.first() {
                Some(&(cursor, rid)) if cursor < behind => {
                    self.catch_up_by(rid, self.cfg.slow_path_batch as u64);
                    steps += 1;
                }
                _ => break,
            }
        }
        steps
    }

    /// FLUSH: drops every entry (the logs' sequence numbers carry on).
    pub fn flush(&mut self) {
        let ids: Vec<RepId> = self.reps.keys().copied().collect();
        for id in ids {
            self.remove_rep(id, Removal::Invalidated);
        }
        debug_assert!(self.pool.is_empty());
        self.filter.clear();
        // Misses in flight read the backend before the flush: they must not refill it.
        self.deletes.cut();
        self.publish_seqs();
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
    pub fn slot(&self, q: &[f32]) -> Option<Slot> {
        self.read.slot(q)
    }
    pub fn insert_log_len(&self) -> usize {
        self.log.len()
    }
    pub fn counters(&self) -> &Counters {
        &self.read.counters
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.read.counters;
        CacheStats {
            lookups: c.lookups.get(),
            exact_hits: c.exact_hits.get(),
            alias_hits: c.alias_hits.get(),
            approximate_hits: c.approximate_hits.get(),
            misses: c.misses.get(),
            verifications: c.verifications.get(),
            admissions: c.admissions.get(),
            admissions_refused: c.admissions_refused.get(),
            evictions: c.evictions.get(),
            invalidations: c.invalidations.get(),
            log_cap_invalidations: c.log_cap_invalidations.get(),
            deletes: c.deletes.get(),
            delete_repairs: c.delete_repairs.get(),
            inserts: c.inserts.get(),
            fast_path_updates: c.fast_path_updates.get(),
            slow_path_steps: c.slow_path_steps.get(),
            slow_path_merges: c.slow_path_merges.get(),
            catch_ups: c.catch_ups.get(),
            hits_with_recent: c.hits_with_recent.get(),
            hits_behind: c.hits_behind.get(),
            aliases_linked: c.aliases_linked.get(),
            alias_promotions: c.alias_promotions.get(),
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
        let table = self.read.table.pin();
        let published = self.read.reps.pin();
        let mut aliases = 0;
        let mut sum_cursor: u128 = 0;
        self.check_index_sizes()?;
        for (&id, rep) in &self.reps {
            self.check_rep(id, rep, &table, &published)
                .map_err(|m| format!("rep {id}: {m}"))?;
            aliases += rep.aliases.len();
            sum_cursor += rep.cursor as u128;
        }
        self.check_reach()?;
        if published.len() != self.reps.len() {
            return Err(format!(
                "{} views published for {} reps",
                published.len(),
                self.reps.len()
            ));
        }
        self.check_pool_holders()?;
        self.check_totals(table.len(), aliases, sum_cursor)?;
        self.check_capacity()
    }

    /// The per-representative indexes hold one entry per representative.
    fn check_index_sizes(&self) -> std::result::Result<(), String> {
        if self.max_d_by_rep.len() != self.reps.len() {
            return Err("maxD map and representatives differ in size".into());
        }
        Ok(())
    }

    /// One representative against everything that refers to it; the message leaves
    /// out which representative (the caller adds it).
    fn check_rep(
        &self,
        id: RepId,
        rep: &Representative,
        table: &PinnedMap<'_, QueryKey, Slot>,
        published: &PinnedMap<'_, RepId, RepView>,
    ) -> std::result::Result<(), String> {
        self.check_rep_list(id, rep)?;
        self.check_rep_links(id, rep, table, published)?;
        self.check_rep_cursor(id, rep)
    }

    /// Its id, its `maxD` in the fast path's indexes, and its list's shape.
    fn check_rep_list(&self, id: RepId, rep: &Representative) -> std::result::Result<(), String> {
        let nrl = &rep.nrl;
        if rep.id != id {
            return Err("id mismatch".into());
        }
        let max_d = self.gauge().filter_max_d(nrl.max_d(), rep.query_norm);
        if self.max_d_by_rep.get(&id) != Some(&max_d) {
            return Err("maxD map out of date".into());
        }
        if nrl.len() < rep.k || nrl.len() > self.answer_len(rep.k) {
            return Err(format!(
                "list length {} outside k..=k+Δ ({})",
                nrl.len(),
                rep.k
            ));
        }
        if nrl.ids.len() != nrl.dists.len() || nrl.ids.len() != nrl.vectors.len() {
            return Err("list columns differ in length".into());
        }
        if !nrl.is_sorted() {
            return Err("list not ascending".into());
        }
        Ok(())
    }

    /// Its published view, the pool objects its list holds, and its key and aliases in
    /// the exact table.
    fn check_rep_links(
        &self,
        id: RepId,
        rep: &Representative,
        table: &PinnedMap<'_, QueryKey, Slot>,
        published: &PinnedMap<'_, RepId, RepView>,
    ) -> std::result::Result<(), String> {
        match published.get(&id) {
            Some(v) if Arc::ptr_eq(&v.nrl, &rep.nrl) && Arc::ptr_eq(&v.state, &rep.state) => {}
            _ => return Err("published view differs from the owner's".into()),
        }
        for &nid in &rep.nrl.ids {
            match self.pool.get(nid) {
                Some(o) if o.holders.contains(&id) => {}
                _ => return Err(format!("id {nid} has no object held by it")),
            }
        }
        if table.get(&rep.key) != Some(&Slot::Representative(id)) {
            return Err("key not in the exact table".into());
        }
        for a in &rep.aliases {
            if table.get(a) != Some(&Slot::Alias(id)) {
                return Err("alias not in the exact table".into());
            }
        }
        Ok(())
    }

    /// Its place in the query filter and the cursor index, and its cursor within the log.
    fn check_rep_cursor(&self, id: RepId, rep: &Representative) -> std::result::Result<(), String> {
        if !self.filter.contains(id) {
            return Err("not in the query filter".into());
        }
        if !self.cursors.contains(&(rep.cursor, id)) {
            return Err("cursor not indexed".into());
        }
        if rep.cursor > self.log.last_seq() || rep.cursor + 1 < self.log.head_seq() {
            return Err(format!(
                "cursor {} outside the log [{}, {}]",
                rep.cursor,
                self.log.head_seq(),
                self.log.last_seq()
            ));
        }
        Ok(())
    }

    /// The fast path's reach is the largest `maxD` of any live list.
    fn check_reach(&self) -> std::result::Result<(), String> {
        let gauge = self.gauge();
        let max_d = self
            .reps
            .values()
            .map(|r| gauge.filter_max_d(r.nrl.max_d(), r.query_norm))
            .reduce(f32::max);
        if self.max_ds.max() != max_d {
            return Err(format!(
                "fast-path reach {:?}, largest maxD {max_d:?}",
                self.max_ds.max()
            ));
        }
        Ok(())
    }

    /// Every pool object is held, and only by representatives that list it.
    fn check_pool_holders(&self) -> std::result::Result<(), String> {
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
        Ok(())
    }

    /// The exact table, the filter and the cursor index count what the representatives
    /// hold (`aliases` and `sum_cursor` summed over them).
    fn check_totals(
        &self,
        table_len: usize,
        aliases: usize,
        sum_cursor: u128,
    ) -> std::result::Result<(), String> {
        if aliases != self.alias_count || table_len != self.reps.len() + aliases {
            return Err(format!(
                "table holds {} keys for {} reps + {} aliases",
                table_len,
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
        Ok(())
    }

    /// What the shard holds is within its capacity.
    fn check_capacity(&self) -> std::result::Result<(), String> {
        // A global budget's share moves under the shard; it must stay within the total.
        let cap = match &self.budget {
            Some((b, _)) => b.total(),
            None => self.capacity_now(),
        };
        let used = match self.cfg.capacity {
            Capacity::Objects(_) => self.pool.len(),
            Capacity::Bytes(_) => self.bytes(),
        };
        if used > cap {
            return Err(format!("{used} over capacity {cap}"));
        }
        Ok(())
    }
}
