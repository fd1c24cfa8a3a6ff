//! Exact-scan filter index: the reference the HNSW one is compared with, and the one
//! the model test and faithfulness runs use. A papaya map, so the owner inserts while
//! readers scan, without locks.

use std::sync::Arc;

use super::{FilterIndex, FilterQuery};
use crate::entry::RepId;
use crate::metric::Metric;

pub struct BruteForceIndex {
    metric: Metric,
    points: papaya::HashMap<RepId, Arc<[f32]>>,
}

impl BruteForceIndex {
    pub fn new(metric: Metric) -> Self {
        BruteForceIndex {
            metric,
            points: papaya::HashMap::new(),
        }
    }
}

impl FilterIndex for BruteForceIndex {
    fn insert(&self, rep: RepId, v: &[f32]) {
        self.points.pin().insert(rep, Arc::from(v));
    }

    fn search(&self, q: &[f32], want: FilterQuery<'_>) -> Vec<(RepId, f32)> {
        let (n, accept) = (want.n, want.accept);
        let mut best: Vec<(RepId, f32)> = Vec::with_capacity(n + 1);
        for (rep, v) in self.points.pin().iter() {
            if !accept(*rep) {
                continue;
            }
            let d = self.metric.distance(q, v);
            let worse = |x: &(RepId, f32)| d.total_cmp(&x.1).then(rep.cmp(&x.0)).is_lt();
            if best.len() < n || best.last().is_some_and(worse) {
                let at = best.iter().position(worse).unwrap_or(best.len());
                best.insert(at, (*rep, d));
                best.truncate(n);
            }
        }
        best
    }

    fn len(&self) -> usize {
        self.points.len()
    }
}
