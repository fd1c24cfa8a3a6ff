//! HNSW filter index on hnsw_rs, with distances from our SIMD kernel (hnsw_rs's own
//! `DistL2` takes a square root and is scalar).

use hnsw_rs::anndists::dist::Distance;
use hnsw_rs::hnsw::Hnsw;

use super::{FilterIndex, FilterQuery};
use crate::entry::RepId;
use crate::metric::Metric;

/// hnsw_rs `Distance` that calls `Metric::distance` (simsimd).
#[derive(Clone, Copy, Debug)]
pub struct SimdDistance(pub Metric);

impl Distance<f32> for SimdDistance {
    fn eval(&self, va: &[f32], vb: &[f32]) -> f32 {
        let d = self.0.distance(va, vb);
        // hnsw_rs asserts distances >= 0. The graph only compares distances, so any
        // increasing map onto [0, inf) keeps its behaviour; callers recompute the true
        // distance from the stored vectors.
        match self.0 {
            Metric::InnerProduct if d >= 0.0 => 1.0 + d,
            Metric::InnerProduct => 1.0 / (1.0 - d),
            Metric::Cosine | Metric::L2Sq => d.max(0.0),
        }
    }
}

pub struct HnswIndex {
    graph: Hnsw<'static, f32, SimdDistance>,
    ef_search: usize,
    len: std::sync::atomic::AtomicUsize,
}

impl HnswIndex {
    pub fn new(
        metric: Metric,
        m: usize,
        ef_construction: usize,
        ef_search: usize,
        capacity_hint: usize,
    ) -> Self {
        let graph = Hnsw::new(
            m,
            capacity_hint.max(16),
            16,
            ef_construction,
            SimdDistance(metric),
        );
        HnswIndex {
            graph,
            ef_search,
            len: Default::default(),
        }
    }
}

impl FilterIndex for HnswIndex {
    fn insert(&self, rep: RepId, v: &[f32]) {
        self.graph.insert_slice((v, rep as usize));
        self.len.fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    fn search(&self, q: &[f32], want: FilterQuery<'_>) -> Vec<(RepId, f32)> {
        let (n, accept) = (want.n, want.accept);
        if self.len() == 0 {
            return Vec::new();
        }
        // Post-filtering: hnsw_rs's own filtered search gives up its early exit and
        // walks much of the graph (200 µs at 100k entries).
        super::post_filtered(n, self.ef_search, 1, accept, |ef| {
            self.graph
                .search_filter(q, ef, ef, None)
                .into_iter()
                .map(|nb| (nb.d_id as RepId, nb.distance))
                .collect()
        })
    }

    fn len(&self) -> usize {
        self.len.load(std::sync::atomic::Ordering::Acquire)
    }
}
