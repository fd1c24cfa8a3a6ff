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
        // Hash the vector's bytes in place; only a vector holding -0.0 is copied, with
        // -0.0 made 0.0, so two vectors that compare equal share a key.
        // A fold, not `any`: without the early exit it vectorises.
        if q.iter()
            .fold(false, |seen, x| seen | (x.to_bits() == NEGATIVE_ZERO))
        {
            let fixed: Vec<f32> = q.iter().map(|&x| if x == 0.0 { 0.0 } else { x }).collect();
            return QueryKey::new(&fixed, k);
        }
        // Safety: f32 has no padding and u8 has alignment 1; the length is in bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(q.as_ptr().cast::<u8>(), std::mem::size_of_val(q))
        };
        QueryKey(xxhash_rust::xxh3::xxh3_128_with_seed(bytes, k as u64))
    }
}

const NEGATIVE_ZERO: u32 = 0x8000_0000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_value_and_k() {
        assert_eq!(
            QueryKey::new(&[1.0, 0.0], 3),
            QueryKey::new(&[1.0, -0.0], 3)
        );
        assert_ne!(QueryKey::new(&[1.0, 0.0], 3), QueryKey::new(&[1.0, 0.0], 4));
        assert_ne!(QueryKey::new(&[1.0, 0.0], 3), QueryKey::new(&[0.0, 1.0], 3));
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
