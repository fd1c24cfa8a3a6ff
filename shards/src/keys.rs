//! The two identifiers the engine's tables are keyed by, in a leaf module both the
//! entries and the exact table import.
//!
//! Query keys are 128-bit xxh3 hashes of the vector's bytes (not of `k`: an entry cached
//! for `k` answers any `k' <= k` from its prefix, `read.rs`). A 64-bit
//! hash (the authors' artifact) can collide within a busy cache's lifetime and would
//! then serve another query's answer; at 128 bits a collision needs ~2^64 distinct
//! queries, so aliases need not store their vectors.

/// Representatives are numbered in admission order, so the FIFO is ascending `RepId`.
pub type RepId = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueryKey(pub u128);

impl QueryKey {
    pub fn new(q: &[f32]) -> Self {
        // Hash the vector's bytes in place; only a vector holding -0.0 is copied, with
        // -0.0 made 0.0, so two vectors that compare equal share a key.
        // A fold, not `any`: without the early exit it vectorises.
        if q.iter()
            .fold(false, |seen, x| seen | (x.to_bits() == NEGATIVE_ZERO))
        {
            let fixed: Vec<f32> = q.iter().map(|&x| if x == 0.0 { 0.0 } else { x }).collect();
            return QueryKey::new(&fixed);
        }
        // SAFETY: f32 has no padding and u8 has alignment 1; the length is in bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(q.as_ptr().cast::<u8>(), std::mem::size_of_val(q))
        };
        QueryKey(xxhash_rust::xxh3::xxh3_128(bytes))
    }
}

const NEGATIVE_ZERO: u32 = 0x8000_0000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_value_only() {
        assert_eq!(QueryKey::new(&[1.0, 0.0]), QueryKey::new(&[1.0, -0.0]));
        assert_ne!(QueryKey::new(&[1.0, 0.0]), QueryKey::new(&[0.0, 1.0]));
    }
}
