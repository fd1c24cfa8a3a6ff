//! Keys of the query lookup table (§4.2, Algorithm 1 step 1), an exact-match map from a
//! query's bytes to its representative or alias entry (a papaya map in [`crate::read`]).
//!
//! Keys are 128-bit xxh3 hashes of the vector's bytes, seeded with `k`. A 64-bit hash
//! (the authors' artifact) can collide within a busy cache's lifetime and would then
//! serve another query's answer; at 128 bits a collision needs ~2^64 distinct queries,
//! so aliases need not store their vectors.

use crate::entry::RepId;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueryKey(pub u128);

impl QueryKey {
    pub fn new(q: &[f32], k: usize) -> Self {
        // Normalise -0.0 to 0.0 so two vectors that compare equal share a key.
        let mut bytes = Vec::with_capacity(q.len() * 4);
        for &x in q {
            let x = if x == 0.0 { 0.0f32 } else { x };
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        QueryKey(xxhash_rust::xxh3::xxh3_128_with_seed(&bytes, k as u64))
    }
}

/// What a key resolves to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The key is a representative's own query: an equality hit.
    Representative(RepId),
    /// The key was served by an approximate hit on this representative before.
    Alias(RepId),
}

impl Slot {
    pub fn rep(self) -> RepId {
        match self {
            Slot::Representative(r) | Slot::Alias(r) => r,
        }
    }
}
