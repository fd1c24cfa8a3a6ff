//! Representative entries (§4.2) and their neighbour lists.
//!
//! The neighbour list is published as an immutable `Arc<NeighborList>`: a mutation
//! builds a new list and swaps it in, so a reader holding the old one is never
//! disturbed (the concurrent read path relies on this).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use crate::gap::Gauge;
use crate::keys::QueryKey;
pub use crate::keys::RepId;

/// Fixed-point scale of risk factors.
pub const RISK_SCALE: f64 = 4_294_967_296.0;

/// `NRL`: up to `k + Δ` results ascending by (distance to `RQ`, id). Each result's
/// vector rides along (when the cache stores vectors) so a hit can re-rank for the
/// request's own vector without touching the shared pool.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NeighborList {
    pub ids: Vec<u64>,
    pub dists: Vec<f32>,
    pub vectors: Vec<Option<Arc<[f32]>>>,
}

impl NeighborList {
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    /// `minD`: distance to the nearest result.
    pub fn min_d(&self) -> f32 {
        self.dists.first().copied().unwrap_or(0.0)
    }
    /// `maxD`: distance to the last result present.
    pub fn max_d(&self) -> f32 {
        self.dists.last().copied().unwrap_or(0.0)
    }
    pub fn position(&self, id: u64) -> Option<usize> {
        self.ids.iter().position(|&x| x == id)
    }
    /// Risk factor `r(e)` (`Gauge::risk_factor`: `d_k / d_(k+Δ)` but on `ip`; 1 when the
    /// list holds no reserve) for a representative with `|RQ| = rq_norm`.
    pub fn risk_factor(&self, k: usize, gauge: Gauge, rq_norm: f32) -> f64 {
        gauge.risk_factor(&self.dists, &self.vectors, k, rq_norm)
    }
    /// Inserts `(id, d)` at its sorted place; returns the place.
    pub fn insert_sorted(&mut self, id: u64, d: f32, v: Option<Arc<[f32]>>) -> usize {
        let at = self.sorted_place(d, id);
        self.ids.insert(at, id);
        self.dists.insert(at, d);
        self.vectors.insert(at, v);
        at
    }
    /// Removes the result at `i`.
    pub fn remove_at(&mut self, i: usize) -> u64 {
        self.dists.remove(i);
        self.vectors.remove(i);
        self.ids.remove(i)
    }
    /// `r(e)` in fixed point (units of 2^-32), so the running sum over all entries
    /// is exact: no drift however many updates it sees.
    pub fn risk_fixed(&self, k: usize, gauge: Gauge, rq_norm: f32) -> u64 {
        (self.risk_factor(k, gauge, rq_norm) * RISK_SCALE).round() as u64
    }
    /// Index at which `(d, id)` belongs in ascending order.
    pub fn sorted_place(&self, d: f32, id: u64) -> usize {
        self.dists
            .iter()
            .zip(&self.ids)
            .position(|(&x, &xid)| d.total_cmp(&x).then(id.cmp(&xid)).is_lt())
            .unwrap_or(self.len())
    }
    pub fn is_sorted(&self) -> bool {
        self.dists
            .windows(2)
            .zip(self.ids.windows(2))
            .all(|(d, i)| d[0].total_cmp(&d[1]).then(i[0].cmp(&i[1])).is_lt())
    }
}

/// A threshold readable and updatable from any thread (f32 bits in an atomic).
#[derive(Debug)]
pub struct AtomicF32(AtomicU32);

impl AtomicF32 {
    pub fn new(v: f32) -> Self {
        AtomicF32(AtomicU32::new(v.to_bits()))
    }
    pub fn load(&self) -> f32 {
        f32::from_bits(self.0.load(Ordering::Relaxed))
    }
    pub fn store(&self, v: f32) {
        self.0.store(v.to_bits(), Ordering::Relaxed)
    }
    /// Compare-and-swap loop: `f` maps the current value to the new one.
    pub fn update(&self, f: impl Fn(f32) -> f32) -> f32 {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let new = f(f32::from_bits(cur));
            match self.0.compare_exchange_weak(
                cur,
                new.to_bits(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return new,
                Err(actual) => cur = actual,
            }
        }
    }
}

/// What readers see of a representative. Immutable but for `tau`: a change to the
/// list publishes a new view (the old one is reclaimed by epochs).
#[derive(Clone, Debug)]
pub struct RepView {
    pub id: RepId,
    pub k: usize,
    /// `RQ`.
    pub query: Arc<[f32]>,
    /// `NRL`.
    pub nrl: Arc<NeighborList>,
    /// `|RQ|` (on `ip` the filter's distances are per unit of it: `gap.rs`).
    pub query_norm: f32,
    /// `minD` in the thresholds' unit (`gap.rs`): `minD` itself on `l2sq` and `cosine`,
    /// the smallest angle to one of the listed results on `ip`. Set by the owner with
    /// each new list.
    pub min_gap: f32,
    /// `LC`: the list accounts for every insert-log record up to this one; a hit checks
    /// the records after it (`recent.rs`). Published with the list it belongs to, so a
    /// reader never pairs a list with a cursor past what the list has seen.
    pub cursor: u64,
    /// What every view of the entry shares and hits update (`τ`, marks): one
    /// allocation, so a hit's reads of it are one cache line, and a view stays at 64
    /// bytes.
    pub state: Arc<EntryState>,
}

/// The part of a representative that hits update in place, shared by all its views.
#[derive(Debug)]
pub struct EntryState {
    /// `τ`, the per-entry similarity threshold.
    pub tau: AtomicF32,
    /// Set by every hit the entry serves, cleared by the second-chance clock
    /// (`Eviction::SecondChance`).
    pub referenced: AtomicBool,
    /// A reader asked the owner to catch this entry up and the owner has not yet: set
    /// by the first hit that finds it behind, cleared by the owner (`Cache::catch_up`),
    /// so many cores send one request.
    pub catch_up_asked: AtomicBool,
}

impl EntryState {
    pub fn new(tau: f32, referenced: bool) -> Self {
        EntryState {
            tau: AtomicF32::new(tau),
            referenced: AtomicBool::new(referenced),
            catch_up_asked: AtomicBool::new(false),
        }
    }
}

impl RepView {
    pub fn max_d(&self) -> f32 {
        self.nrl.max_d()
    }
}

/// The owner's record of a representative: the published view plus what only the
/// owner reads.
#[derive(Debug)]
pub struct Representative {
    pub view: RepView,
    pub key: QueryKey,
    /// Keys linked to this entry by approximate hits (§4.2 entry linking).
    pub aliases: Vec<QueryKey>,
}

impl std::ops::Deref for Representative {
    type Target = RepView;
    fn deref(&self) -> &RepView {
        &self.view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hit on a random entry of a large cache is bound by memory: its view should stay
    /// one cache line (a view of 80 bytes cost exact hits ~10% at 100,000 entries).
    #[test]
    fn a_view_is_one_cache_line() {
        assert!(
            std::mem::size_of::<RepView>() <= 64,
            "{}",
            std::mem::size_of::<RepView>()
        );
    }
}
