//! Brute-force store: exact answers with the SIMD kernel.

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::{sort_candidates, Backend, Candidate};
use crate::error::{validate_vector, Result};
use crate::metric::Metric;

pub struct ExactStore {
    dim: usize,
    metric: Metric,
    ids: Vec<u64>,
    vectors: Vec<Arc<[f32]>>,
    index: HashMap<u64, usize>,
}

impl ExactStore {
    pub fn new(dim: usize, metric: Metric) -> Self {
        ExactStore {
            dim,
            metric,
            ids: Vec::new(),
            vectors: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Rows of a row-major matrix, ids `0..n`.
    pub fn from_rows(dim: usize, metric: Metric, data: &[f32]) -> Result<Self> {
        let ids: Vec<u64> = (0..(data.len() / dim.max(1)) as u64).collect();
        ExactStore::from_rows_with_ids(dim, metric, &ids, data)
    }

    /// Rows of a row-major matrix with their ids (a recovered store).
    pub fn from_rows_with_ids(
        dim: usize,
        metric: Metric,
        ids: &[u64],
        data: &[f32],
    ) -> Result<Self> {
        let mut s = ExactStore::new(dim, metric);
        for (&id, row) in ids.iter().zip(data.chunks_exact(dim.max(1))) {
            s.insert(id, row)?;
        }
        Ok(s)
    }

    pub fn vector(&self, id: u64) -> Option<&Arc<[f32]>> {
        self.index.get(&id).map(|&i| &self.vectors[i])
    }
}

impl Backend for ExactStore {
    fn dim(&self) -> usize {
        self.dim
    }
    fn metric(&self) -> Metric {
        self.metric
    }
    fn search(&self, q: &[f32], n: usize) -> Result<Vec<Candidate>> {
        validate_vector(q, self.dim)?;
        let mut all: Vec<(f32, usize)> = self
            .vectors
            .iter()
            .enumerate()
            .map(|(i, v)| (self.metric.distance(q, v), i))
            .collect();
        let by = |a: &(f32, usize), b: &(f32, usize)| {
            a.0.total_cmp(&b.0).then(self.ids[a.1].cmp(&self.ids[b.1]))
        };
        if n < all.len() {
            all.select_nth_unstable_by(n, by);
            all.truncate(n);
        }
        let mut out: Vec<Candidate> = all
            .into_iter()
            .map(|(d, i)| Candidate {
                id: self.ids[i],
                distance: d,
                vector: Some(self.vectors[i].clone()),
            })
            .collect();
        sort_candidates(&mut out);
        Ok(out)
    }
    fn insert(&mut self, id: u64, v: &[f32]) -> Result<()> {
        validate_vector(v, self.dim)?;
        let v: Arc<[f32]> = Arc::from(v);
        match self.index.get(&id) {
            Some(&i) => self.vectors[i] = v,
            None => {
                self.index.insert(id, self.ids.len());
                self.ids.push(id);
                self.vectors.push(v);
            }
        }
        Ok(())
    }
    fn delete(&mut self, id: u64) -> Result<bool> {
        let Some(i) = self.index.remove(&id) else {
            return Ok(false);
        };
        self.ids.swap_remove(i);
        self.vectors.swap_remove(i);
        if i < self.ids.len() {
            self.index.insert(self.ids[i], i);
        }
        Ok(true)
    }
    fn len(&self) -> usize {
        self.ids.len()
    }
    fn export(&self) -> Option<Vec<(u64, Arc<[f32]>)>> {
        Some(
            self.ids
                .iter()
                .copied()
                .zip(self.vectors.iter().cloned())
                .collect(),
        )
    }
    fn contains(&self, id: u64) -> Option<bool> {
        Some(self.index.contains_key(&id))
    }
    fn name(&self) -> &'static str {
        "exact"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_search_insert_delete() {
        let mut s = ExactStore::from_rows(1, Metric::L2Sq, &[0.0, 1.0, 2.0, 3.0]).unwrap();
        let ids = |s: &ExactStore| {
            s.search(&[1.9], 2)
                .unwrap()
                .iter()
                .map(|c| c.id)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&s), vec![2, 1]);
        s.delete(2).unwrap();
        assert_eq!(ids(&s), vec![1, 3]);
        s.insert(9, &[1.95]).unwrap();
        assert_eq!(ids(&s), vec![9, 1]);
        assert!(!s.delete(2).unwrap());
        assert!(s.search(&[1.0, 2.0], 1).is_err());
    }
}
