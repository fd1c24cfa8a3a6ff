//! The dual query filter (§4.7): an ANN index over representative queries, in two
//! generations so that evictions never need per-entry deletes from the graph.
//!
//! ```text
//!   admit ──► active (F_A) ── inserts only
//!   evict ──► whichever generation holds the entry: tombstone (skipped by searches)
//!   tombstones > live ──► rotate:  new active = empty
//!                                  standby   = old active (sealed)
//!                                  old standby dropped; its *live* entries are
//!                                  re-inserted into the new active (never lost)
//!   lookup ──► search both, merge, nearest first
//! ```

mod brute;
mod hnsw;
pub use hnsw::SimdDistance;

pub use brute::BruteForceIndex;
pub use hnsw::HnswIndex;

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::FilterKind;
use crate::entry::RepId;
use crate::metric::Metric;

/// One generation's index. Tombstones are not the index's business: searches take a
/// predicate and return only accepted ids.
pub trait FilterIndex: Send + Sync {
    fn insert(&mut self, rep: RepId, v: &[f32]);
    /// Up to `n` accepted reps near `q`. The distances may be any increasing map of the
    /// true ones: the caller recomputes them.
    fn search(&self, q: &[f32], n: usize, accept: &dyn Fn(RepId) -> bool) -> Vec<(RepId, f32)>;
    /// Points inserted, tombstoned ones included.
    fn len(&self) -> usize;
}

fn new_index(kind: FilterKind, metric: Metric, capacity_hint: usize) -> Box<dyn FilterIndex> {
    match kind {
        FilterKind::BruteForce => Box::new(BruteForceIndex::new(metric)),
        FilterKind::Hnsw {
            m,
            ef_construction,
            ef_search,
        } => Box::new(HnswIndex::new(
            metric,
            m,
            ef_construction,
            ef_search,
            capacity_hint,
        )),
    }
}

struct Generation {
    index: Box<dyn FilterIndex>,
    /// Live members with their vectors (kept to re-insert survivors at rotation).
    live: HashMap<RepId, Arc<[f32]>>,
    tombstones: usize,
}

impl Generation {
    fn new(kind: FilterKind, metric: Metric, hint: usize) -> Self {
        Generation {
            index: new_index(kind, metric, hint),
            live: HashMap::new(),
            tombstones: 0,
        }
    }
}

/// Counters for STATS and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilterStats {
    pub live: usize,
    pub tombstones: usize,
    pub rotations: u64,
    pub reinserted_on_rotation: u64,
}

pub struct DualFilter {
    kind: FilterKind,
    metric: Metric,
    active: Generation,
    standby: Generation,
    rotations: u64,
    reinserted: u64,
}

impl DualFilter {
    pub fn new(kind: FilterKind, metric: Metric) -> Self {
        DualFilter {
            kind,
            metric,
            active: Generation::new(kind, metric, 1024),
            standby: Generation::new(kind, metric, 16),
            rotations: 0,
            reinserted: 0,
        }
    }

    pub fn insert(&mut self, rep: RepId, v: Arc<[f32]>) {
        debug_assert!(!self.contains(rep));
        self.active.index.insert(rep, &v);
        self.active.live.insert(rep, v);
    }

    pub fn contains(&self, rep: RepId) -> bool {
        self.active.live.contains_key(&rep) || self.standby.live.contains_key(&rep)
    }

    /// Tombstones `rep`, then rotates if tombstones outnumber live entries.
    pub fn remove(&mut self, rep: RepId) -> bool {
        let gen = if self.standby.live.remove(&rep).is_some() {
            &mut self.standby
        } else if self.active.live.remove(&rep).is_some() {
            &mut self.active
        } else {
            return false;
        };
        gen.tombstones += 1;
        // Each rotation drops the standby's tombstones, so two rounds always suffice.
        for _ in 0..2 {
            if self.tombstones() > self.live() {
                self.rotate();
            }
        }
        true
    }

    fn rotate(&mut self) {
        let hint = self.active.live.len().max(1024);
        let fresh = Generation::new(self.kind, self.metric, hint);
        let sealed = std::mem::replace(&mut self.active, fresh);
        let dropped = std::mem::replace(&mut self.standby, sealed);
        // The artifact loses these; a live representative must stay findable.
        let mut survivors: Vec<_> = dropped.live.into_iter().collect();
        survivors.sort_by_key(|(r, _)| *r);
        self.reinserted += survivors.len() as u64;
        for (rep, v) in survivors {
            self.active.index.insert(rep, &v);
            self.active.live.insert(rep, v);
        }
        self.rotations += 1;
    }

    /// Up to `n` live accepted reps nearest to `q` over both generations,
    /// ascending by (distance, rep).
    pub fn search(&self, q: &[f32], n: usize, accept: &dyn Fn(RepId) -> bool) -> Vec<(RepId, f32)> {
        let mut out = Vec::with_capacity(2 * n);
        for gen in [&self.active, &self.standby] {
            if gen.live.is_empty() {
                continue;
            }
            let ok = |r: RepId| gen.live.contains_key(&r) && accept(r);
            // The exact distance with the SIMD kernel, whatever the index reported.
            out.extend(
                gen.index
                    .search(q, n, &ok)
                    .into_iter()
                    .map(|(r, _)| (r, self.metric.distance(q, &gen.live[&r]))),
            );
        }
        out.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        out.truncate(n);
        out
    }

    pub fn live(&self) -> usize {
        self.active.live.len() + self.standby.live.len()
    }
    pub fn tombstones(&self) -> usize {
        self.active.tombstones + self.standby.tombstones
    }
    pub fn stats(&self) -> FilterStats {
        FilterStats {
            live: self.live(),
            tombstones: self.tombstones(),
            rotations: self.rotations,
            reinserted_on_rotation: self.reinserted,
        }
    }
    pub fn clear(&mut self) {
        *self = DualFilter::new(self.kind, self.metric);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(x: f32) -> Arc<[f32]> {
        Arc::from(vec![x, 0.0])
    }

    fn rotation_keeps_survivors(kind: FilterKind) {
        let mut f = DualFilter::new(kind, Metric::L2Sq);
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
    fn rotation_keeps_survivors_hnsw() {
        rotation_keeps_survivors(FilterKind::default());
    }

    #[test]
    fn search_merges_generations_nearest_first() {
        let mut f = DualFilter::new(FilterKind::BruteForce, Metric::L2Sq);
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
}
