//! The `Backend` trait: the vector database behind the cache. The server, the
//! experiment runner and the tests all talk to a store through it.
//!
//! A backend answer is `n` candidates ascending by distance (ALGORITHM.md: `k + Δ`
//! pairs). A candidate may carry its vector (the in-memory stores always do) so that
//! a cache that keeps vectors can re-rank for a request's own vector.

use std::sync::Arc;

use crate::error::Result;
use crate::metric::Metric;

/// One search result.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub id: u64,
    /// Distance from the query, in the metric's unit (squared L2, `1 - cos`, `-dot`).
    pub distance: f32,
    pub vector: Option<Arc<[f32]>>,
}

impl Candidate {
    pub fn new(id: u64, distance: f32) -> Self {
        Candidate {
            id,
            distance,
            vector: None,
        }
    }
}

pub trait Backend: Send {
    fn dim(&self) -> usize;
    fn metric(&self) -> Metric;
    /// The `n` nearest live vectors to `q`, ascending by distance (ties by id).
    fn search(&self, q: &[f32], n: usize) -> Result<Vec<Candidate>>;
    /// Inserts or replaces `id`.
    fn insert(&mut self, id: u64, v: &[f32]) -> Result<()>;
    /// Removes `id`; `false` when it was not there.
    fn delete(&mut self, id: u64) -> Result<bool>;
    /// Live vectors.
    fn len(&self) -> usize;
    /// Whether `id` is live; `None` where the backend cannot say cheaply.
    fn contains(&self, _id: u64) -> Option<bool> {
        None
    }
    /// Every live row (for a checkpoint); `None` where the backend does not hold them.
    fn export(&self) -> Option<Vec<(u64, Arc<[f32]>)>> {
        None
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn name(&self) -> &'static str;
    /// The HNSW store behind this backend, if it is one (a checkpoint saves its graph).
    fn as_hnsw(&self) -> Option<&crate::store::HnswStore> {
        None
    }
}

/// Sorts candidates ascending by (distance, id): the one order every component uses,
/// so that ties never make two implementations disagree.
pub fn sort_candidates(c: &mut [Candidate]) {
    c.sort_by(|a, b| a.distance.total_cmp(&b.distance).then(a.id.cmp(&b.id)));
}
