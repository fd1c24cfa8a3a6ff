//! The "exact" backend of the experiment runner: it answers from exact neighbour lists
//! computed beforehand (brute force, `groundtruth`) for every vector a workload can
//! send, so a full report costs table look-ups instead of 100,000 scans per run. A
//! vector it was not prepared for is an error, never a silently wrong answer.

use std::collections::HashMap;

use shards::{Backend, Candidate, Error, Metric, Result};

pub struct PrecomputedBackend {
    dim: usize,
    metric: Metric,
    /// Collection size the lists were computed over (what `len` reports).
    collection: usize,
    /// The f32 bit patterns of a vector -> its list. Bit patterns, so `-0.0` and `0.0`
    /// stay distinct keys exactly as they are distinct requests for the cache.
    index: HashMap<Box<[u32]>, u32>,
    lists: Vec<Vec<Candidate>>,
}

impl PrecomputedBackend {
    /// Answers for `vectors` (row-major, `dim` floats each): row `i` gets `lists[i]`,
    /// which must be ascending and at least as long as any search will ask for.
    /// Duplicate rows keep the first row's list (equal vectors have equal answers).
    pub fn new(
        dim: usize,
        metric: Metric,
        collection: usize,
        vectors: &[f32],
        lists: Vec<Vec<Candidate>>,
    ) -> PrecomputedBackend {
        assert_eq!(
            vectors.len(),
            dim * lists.len(),
            "one exact list per {dim}-d vector"
        );
        let mut index = HashMap::with_capacity(lists.len());
        for (i, row) in vectors.chunks_exact(dim).enumerate() {
            index.entry(bits(row)).or_insert(i as u32);
        }
        PrecomputedBackend {
            dim,
            metric,
            collection,
            index,
            lists,
        }
    }

    /// The prepared list for `q`, if there is one.
    pub fn list(&self, q: &[f32]) -> Option<&[Candidate]> {
        self.index
            .get(&bits(q))
            .map(|&i| self.lists[i as usize].as_slice())
    }
}

fn bits(v: &[f32]) -> Box<[u32]> {
    v.iter().map(|x| x.to_bits()).collect()
}

impl Backend for PrecomputedBackend {
    fn dim(&self) -> usize {
        self.dim
    }

    fn metric(&self) -> Metric {
        self.metric
    }

    fn search(&self, q: &[f32], n: usize) -> Result<Vec<Candidate>> {
        let list = self.list(q).ok_or_else(|| {
            Error::Backend("precomputed backend: no exact answer prepared for this vector".into())
        })?;
        if list.len() < n.min(self.collection) {
            return Err(Error::Backend(format!(
                "precomputed backend: {n} results asked, {} prepared",
                list.len()
            )));
        }
        Ok(list[..n.min(list.len())].to_vec())
    }

    fn insert(&mut self, _id: u64, _v: &[f32]) -> Result<()> {
        Err(Error::Backend(
            "precomputed backend: read-only (answers are fixed in advance)".into(),
        ))
    }

    fn delete(&mut self, _id: u64) -> Result<bool> {
        Err(Error::Backend(
            "precomputed backend: read-only (answers are fixed in advance)".into(),
        ))
    }

    fn len(&self) -> usize {
        self.collection
    }

    fn name(&self) -> &'static str {
        "exact-precomputed"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(ids: &[u64]) -> Vec<Candidate> {
        ids.iter()
            .enumerate()
            .map(|(i, &id)| Candidate::new(id, i as f32))
            .collect()
    }

    #[test]
    fn answers_prepared_vectors_and_refuses_others() {
        let b = PrecomputedBackend::new(
            2,
            Metric::L2Sq,
            100,
            &[0.0, 1.0, 2.0, 3.0, 0.0, 1.0],
            vec![list(&[5, 6, 7]), list(&[8, 9, 10]), list(&[1, 2, 3])],
        );
        let ids = |v: Vec<Candidate>| v.into_iter().map(|c| c.id).collect::<Vec<_>>();
        assert_eq!(ids(b.search(&[2.0, 3.0], 2).unwrap()), vec![8, 9]);
        // The duplicate row keeps the first row's answer.
        assert_eq!(ids(b.search(&[0.0, 1.0], 3).unwrap()), vec![5, 6, 7]);
        assert!(b.search(&[0.0, 1.5], 1).is_err());
        assert!(b.search(&[-0.0, 1.0], 1).is_err(), "bit patterns, not values");
        assert!(b.search(&[0.0, 1.0], 4).is_err(), "deeper than prepared");
        assert_eq!(b.len(), 100);
    }
}
