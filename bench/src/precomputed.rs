//! Backends that answer from lists computed beforehand for every vector a workload can
//! send, so a full report costs table look-ups instead of 100,000 searches per run.
//!
//! - The "exact" backend: exact neighbour lists (brute force, `groundtruth`).
//! - A memoised backend ([`PrecomputedBackend::memoise`]): the answers of a real one
//!   (the HNSW store) to each distinct vector, searched once. Equivalent to asking it
//!   every time because the collection is static and an HNSW search is deterministic
//!   for a built graph ([`PrecomputedBackend::disagreements`] checks that).
//!
//! A vector it was not prepared for is an error, never a silently wrong answer.

use std::collections::HashMap;
use std::sync::Arc;

use aker_formats::data::Dataset;
use shards::{Backend, Candidate, Error, Metric, Result};

pub struct PrecomputedBackend {
    name: &'static str,
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
            name: "exact-precomputed",
            dim,
            metric,
            collection,
            index,
            lists,
        }
    }

    /// `backend`'s top `n` for each row of `vectors`, searched on `threads` threads
    /// (`progress` gets the rows done), kept as a backend of the same name. Candidate
    /// vectors are dropped: the runs keep ids only.
    pub fn memoise<B: Backend + Sync>(
        backend: &B,
        vectors: &[f32],
        n: usize,
        threads: usize,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<PrecomputedBackend> {
        let dim = backend.dim();
        let rows = vectors.len() / dim;
        let per_thread = rows.div_ceil(threads.max(1)).max(1);
        let parts: Vec<Result<Vec<Vec<Candidate>>>> = std::thread::scope(|s| {
            let handles: Vec<_> = vectors
                .chunks(per_thread * dim)
                .map(|chunk| {
                    s.spawn(move || {
                        let mut out = Vec::with_capacity(chunk.len() / dim);
                        for q in chunk.chunks_exact(dim) {
                            let mut list = backend.search(q, n)?;
                            list.iter_mut().for_each(|c| c.vector = None);
                            out.push(list);
                            progress(1);
                        }
                        Ok(out)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("memoising worker panicked"))
                .collect()
        });
        let mut lists = Vec::with_capacity(rows);
        for part in parts {
            lists.extend(part?);
        }
        let mut memo =
            PrecomputedBackend::new(dim, backend.metric(), backend.len(), vectors, lists);
        memo.name = backend.name();
        Ok(memo)
    }

    /// How many of `vectors` `backend` now answers differently (ids, top `n`) from the
    /// memoised lists: 0 unless its searches are not repeatable.
    pub fn disagreements(&self, backend: &dyn Backend, vectors: &[f32], n: usize) -> Result<usize> {
        let mut differ = 0;
        for q in vectors.chunks_exact(self.dim) {
            let fresh = backend.search(q, n)?;
            let memo = self.search(q, n)?;
            if !fresh.iter().map(|c| c.id).eq(memo.iter().map(|c| c.id)) {
                differ += 1;
            }
        }
        Ok(differ)
    }

    /// The prepared list for `q`, if there is one.
    pub fn list(&self, q: &[f32]) -> Option<&[Candidate]> {
        self.index
            .get(&bits(q))
            .map(|&i| self.lists[i as usize].as_slice())
    }
}

/// What a write to a backend of fixed answers gets.
fn read_only<T>() -> Result<T> {
    Err(Error::Backend(
        "precomputed backend: read-only (answers are fixed in advance)".into(),
    ))
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
        read_only()
    }

    fn delete(&mut self, _id: u64) -> Result<bool> {
        read_only()
    }

    fn len(&self) -> usize {
        self.collection
    }

    fn name(&self) -> &'static str {
        self.name
    }
}

/// `inner`'s answers with each neighbour's vector attached from the collection (ids are
/// row numbers), as akerd's embedded stores return them: what a `store_vectors` cache
/// keeps and re-ranks its hits with. The lists themselves are `inner`'s.
pub struct WithVectors<'a> {
    inner: &'a (dyn Backend + Sync),
    collection: &'a Dataset,
}

impl<'a> WithVectors<'a> {
    pub fn new(inner: &'a (dyn Backend + Sync), collection: &'a Dataset) -> WithVectors<'a> {
        assert_eq!(inner.dim(), collection.dim, "one dimension");
        WithVectors { inner, collection }
    }
}

impl Backend for WithVectors<'_> {
    fn dim(&self) -> usize {
        self.inner.dim()
    }

    fn metric(&self) -> Metric {
        self.inner.metric()
    }

    fn search(&self, q: &[f32], n: usize) -> Result<Vec<Candidate>> {
        let mut list = self.inner.search(q, n)?;
        for c in &mut list {
            let row = usize::try_from(c.id)
                .ok()
                .filter(|&i| i < self.collection.n)
                .ok_or_else(|| Error::Backend(format!("id {} is not a collection row", c.id)))?;
            c.vector = Some(Arc::from(self.collection.row(row)));
        }
        Ok(list)
    }

    fn insert(&mut self, _id: u64, _v: &[f32]) -> Result<()> {
        read_only()
    }

    fn delete(&mut self, _id: u64) -> Result<bool> {
        read_only()
    }

    fn len(&self) -> usize {
        self.inner.len()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
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
        assert!(
            b.search(&[-0.0, 1.0], 1).is_err(),
            "bit patterns, not values"
        );
        assert!(b.search(&[0.0, 1.0], 4).is_err(), "deeper than prepared");
        assert_eq!(b.len(), 100);
    }

    #[test]
    fn with_vectors_attaches_each_neighbour_s_row() {
        let collection = Dataset::new(2, (0..20).map(|i| i as f32).collect()).unwrap();
        let b = PrecomputedBackend::new(
            2,
            Metric::L2Sq,
            10,
            &[0.5, 0.5, 9.0, 9.0],
            vec![list(&[3, 1]), list(&[2, 12])],
        );
        let v = WithVectors::new(&b, &collection);
        let got = v.search(&[0.5, 0.5], 2).unwrap();
        assert_eq!(got.iter().map(|c| c.id).collect::<Vec<_>>(), vec![3, 1]);
        assert_eq!(got[0].vector.as_deref(), Some(&[6.0, 7.0][..]));
        assert_eq!(got[1].vector.as_deref(), Some(&[2.0, 3.0][..]));
        assert!(
            v.search(&[9.0, 9.0], 2).is_err(),
            "id 12 is past the collection"
        );
        assert_eq!((v.len(), v.dim(), v.name()), (10, 2, b.name()));
    }

    #[test]
    fn memoised_answers_equal_the_backend_s() {
        let dim = 4;
        let rows: Vec<f32> = (0..500 * dim)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
            .collect();
        let store = shards::store::ExactStore::from_rows(dim, Metric::L2Sq, &rows).unwrap();
        let queries = &rows[..60 * dim];
        let memo = PrecomputedBackend::memoise(&store, queries, 5, 3, &|_| {}).unwrap();
        assert_eq!(memo.name(), store.name());
        assert_eq!(memo.len(), 500);
        for q in queries.chunks_exact(dim) {
            let want: Vec<(u64, f32)> = store
                .search(q, 5)
                .unwrap()
                .into_iter()
                .map(|c| (c.id, c.distance))
                .collect();
            let got = memo.search(q, 5).unwrap();
            assert!(got.iter().all(|c| c.vector.is_none()));
            assert_eq!(
                got.into_iter()
                    .map(|c| (c.id, c.distance))
                    .collect::<Vec<_>>(),
                want
            );
        }
        assert_eq!(memo.disagreements(&store, queries, 5).unwrap(), 0);
    }
}
