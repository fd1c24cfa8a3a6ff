//! HNSW store on hnsw_rs with the SIMD distance. hnsw_rs cannot delete, so deletes and
//! replaced vectors are tombstones that searches filter out.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use hnsw_rs::hnsw::Hnsw;

use crate::backend::{sort_candidates, Backend, Candidate};
use crate::error::{validate_vector, Result};
use crate::filter::SimdDistance;
use crate::metric::Metric;

pub struct HnswStore {
    dim: usize,
    metric: Metric,
    graph: Hnsw<'static, f32, SimdDistance>,
    /// Search breadth; the runner tunes it for a target recall.
    pub ef_search: usize,
    /// Internal point number -> (external id, vector).
    points: Vec<(u64, Arc<[f32]>)>,
    /// External id -> its live internal point.
    live: HashMap<u64, usize>,
    dead: HashSet<usize>,
}

impl HnswStore {
    pub fn new(
        dim: usize,
        metric: Metric,
        m: usize,
        ef_construction: usize,
        ef_search: usize,
        capacity_hint: usize,
    ) -> Self {
        HnswStore {
            dim,
            metric,
            graph: Hnsw::new(
                m,
                capacity_hint.max(16),
                16,
                ef_construction,
                SimdDistance(metric),
            ),
            ef_search,
            points: Vec::new(),
            live: HashMap::new(),
            dead: HashSet::new(),
        }
    }

    /// Builds from a row-major matrix (ids `0..n`) with hnsw_rs's parallel insert.
    pub fn build(
        dim: usize,
        metric: Metric,
        data: &[f32],
        m: usize,
        ef_construction: usize,
        ef_search: usize,
    ) -> Result<Self> {
        let ids: Vec<u64> = (0..(data.len() / dim.max(1)) as u64).collect();
        HnswStore::build_with_ids(dim, metric, &ids, data, m, ef_construction, ef_search)
    }

    /// `build` with the rows' ids (a recovered store); a repeated id keeps its last row.
    pub fn build_with_ids(
        dim: usize,
        metric: Metric,
        ids: &[u64],
        data: &[f32],
        m: usize,
        ef_construction: usize,
        ef_search: usize,
    ) -> Result<Self> {
        let n = data.len() / dim.max(1);
        let mut s = HnswStore::new(dim, metric, m, ef_construction, ef_search, n);
        for (i, (&id, row)) in ids.iter().zip(data.chunks_exact(dim.max(1))).enumerate() {
            validate_vector(row, dim)?;
            s.points.push((id, Arc::from(row)));
            if let Some(old) = s.live.insert(id, i) {
                s.dead.insert(old);
            }
        }
        let rows: Vec<(&[f32], usize)> = s
            .points
            .iter()
            .enumerate()
            .map(|(i, (_, v))| (&v[..], i))
            .collect();
        s.graph.parallel_insert_slice(&rows);
        Ok(s)
    }
}

impl Backend for HnswStore {
    fn dim(&self) -> usize {
        self.dim
    }
    fn metric(&self) -> Metric {
        self.metric
    }
    fn search(&self, q: &[f32], n: usize) -> Result<Vec<Candidate>> {
        validate_vector(q, self.dim)?;
        if self.live.is_empty() {
            return Ok(Vec::new());
        }
        // Post-filter the tombstones (hnsw_rs's filtered search loses its early exit);
        // ask for as many extra as there are dead points, within reason.
        let want = (n + self.dead.len()).min(n * 4 + 16);
        let found = self
            .graph
            .search_filter(q, want, self.ef_search.max(want), None);
        let mut out: Vec<Candidate> = found
            .into_iter()
            .filter(|nb| !self.dead.contains(&nb.d_id))
            .take(n)
            .map(|nb| {
                let (id, v) = &self.points[nb.d_id];
                Candidate {
                    id: *id,
                    distance: self.metric.distance(q, v),
                    vector: Some(v.clone()),
                }
            })
            .collect();
        sort_candidates(&mut out);
        Ok(out)
    }
    fn insert(&mut self, id: u64, v: &[f32]) -> Result<()> {
        validate_vector(v, self.dim)?;
        if let Some(old) = self.live.remove(&id) {
            self.dead.insert(old);
        }
        let p = self.points.len();
        self.points.push((id, Arc::from(v)));
        self.graph.insert_slice((v, p));
        self.live.insert(id, p);
        Ok(())
    }
    fn delete(&mut self, id: u64) -> Result<bool> {
        match self.live.remove(&id) {
            Some(p) => {
                self.dead.insert(p);
                Ok(true)
            }
            None => Ok(false),
        }
    }
    fn len(&self) -> usize {
        self.live.len()
    }
    fn export(&self) -> Option<Vec<(u64, Arc<[f32]>)>> {
        let mut live: Vec<(usize, u64)> = self.live.iter().map(|(&id, &p)| (p, id)).collect();
        live.sort_unstable();
        Some(
            live.into_iter()
                .map(|(p, id)| (id, self.points[p].1.clone()))
                .collect(),
        )
    }
    fn contains(&self, id: u64) -> Option<bool> {
        Some(self.live.contains_key(&id))
    }
    fn name(&self) -> &'static str {
        "hnsw"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ExactStore;

    #[test]
    fn hnsw_store_finds_neighbours_and_honours_deletes() {
        let dim = 8;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let data: Vec<f32> = (0..2000 * dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mut h = HnswStore::build(dim, Metric::L2Sq, &data, 16, 100, 64).unwrap();
        let e = ExactStore::from_rows(dim, Metric::L2Sq, &data).unwrap();
        let q = &data[5 * dim..6 * dim];
        let got: Vec<u64> = h.search(q, 10).unwrap().iter().map(|c| c.id).collect();
        let want: Vec<u64> = e.search(q, 10).unwrap().iter().map(|c| c.id).collect();
        let overlap = got.iter().filter(|x| want.contains(x)).count();
        assert!(overlap >= 8, "recall {overlap}/10");
        assert!(got.contains(&5));
        h.delete(5).unwrap();
        assert!(h.search(q, 10).unwrap().iter().all(|c| c.id != 5));
        h.insert(5, q).unwrap();
        assert_eq!(h.search(q, 1).unwrap()[0].id, 5);
        assert_eq!(h.len(), 2000);
    }
}
