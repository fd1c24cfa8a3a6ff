//! In-memory vector stores behind the [`Backend`](crate::Backend) trait: the exact
//! brute-force one (ground truth, tests) and the HNSW one (the embedded default's index).

mod exact;
mod hnsw;

pub use exact::ExactStore;
pub use hnsw::{HnswParams, HnswSaved, HnswStore};
