//! Slots of the query lookup table (§4.2, Algorithm 1 step 1), an exact-match map from
//! a query's key ([`QueryKey`]) to its representative or alias entry (a papaya map in
//! [`crate::read`]).

pub use crate::keys::{QueryKey, RepId};

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
