//! The neighbour object pool (§4.2): one object per result id, shared by every entry
//! that lists it, reference-counted by its holders.
//!
//! Each object keeps the list of representatives holding it (its reference count is
//! that list's length), so a delete reaches exactly the entries it affects without a
//! scan (ALGORITHM.md: "every entry that listed it promotes its next reserve result").

use std::sync::Arc;

use smallvec::SmallVec;

use crate::entry::RepId;
use crate::hash::HashMap;

/// Bytes charged per object beyond its vector and payload (map slot, holder list).
pub(crate) const OBJECT_OVERHEAD_BYTES: usize = 64;

/// The representatives holding an object. Most objects have one or two, kept inline:
/// a heap list per object cost every acquire and release a second cache miss and an
/// allocation or free (a fifth of a d = 768 admission in a profile).
pub(crate) type Holders = SmallVec<[RepId; 2]>;

#[derive(Debug, Default)]
pub(crate) struct NeighborObject {
    pub vector: Option<Arc<[f32]>>,
    pub payload: Option<Arc<[u8]>>,
    /// Representatives whose `NRL` lists this id; `holders.len()` is the reference count.
    pub holders: Holders,
}

#[derive(Debug, Default)]
pub(crate) struct NeighborPool {
    objects: HashMap<u64, NeighborObject>,
    /// Bytes of vectors and payloads (holder lists are charged at a flat rate).
    data_bytes: usize,
}

impl NeighborPool {
    pub(crate) fn len(&self) -> usize {
        self.objects.len()
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
    pub(crate) fn get(&self, id: u64) -> Option<&NeighborObject> {
        self.objects.get(&id)
    }
    pub(crate) fn contains(&self, id: u64) -> bool {
        self.objects.contains_key(&id)
    }
    /// Estimated bytes held by the pool.
    pub(crate) fn bytes(&self) -> usize {
        self.objects.len() * OBJECT_OVERHEAD_BYTES + self.data_bytes
    }

    /// Looks `ids` up without using the answers, so that their cache misses overlap
    /// (the lookups are independent) before a loop of `acquire` / `release` on the same
    /// ids, each of which would otherwise wait for its own: the map holds a cache's
    /// worth of objects, and those misses were a sixth of an admission at d = 768.
    pub(crate) fn warm(&self, ids: impl Iterator<Item = u64>) {
        for id in ids {
            std::hint::black_box(self.objects.get(&id));
        }
    }

    /// Takes a reference on `id` for `rep`, creating the object if needed. A vector or
    /// payload given here fills an object that has none.
    pub(crate) fn acquire(
        &mut self,
        id: u64,
        rep: RepId,
        vector: Option<Arc<[f32]>>,
        payload: Option<Arc<[u8]>>,
    ) {
        let obj = self.objects.entry(id).or_default();
        if obj.vector.is_none() {
            if let Some(v) = vector {
                self.data_bytes += v.len() * 4;
                obj.vector = Some(v);
            }
        }
        if obj.payload.is_none() {
            if let Some(p) = payload {
                self.data_bytes += p.len();
                obj.payload = Some(p);
            }
        }
        debug_assert!(!obj.holders.contains(&rep), "rep {rep} holds id {id} twice");
        obj.holders.push(rep);
    }

    /// Drops `rep`'s reference on `id`; frees the object at zero. True when freed.
    pub(crate) fn release(&mut self, id: u64, rep: RepId) -> bool {
        let Some(obj) = self.objects.get_mut(&id) else {
            debug_assert!(false, "release of absent object {id}");
            return false;
        };
        if let Some(i) = obj.holders.iter().position(|&h| h == rep) {
            obj.holders.swap_remove(i);
        }
        if obj.holders.is_empty() {
            self.remove(id);
            true
        } else {
            false
        }
    }

    /// Removes the object whatever its references; returns its holders.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Holders> {
        let obj = self.objects.remove(&id)?;
        self.data_bytes -= obj.vector.as_ref().map_or(0, |v| v.len() * 4)
            + obj.payload.as_ref().map_or(0, |p| p.len());
        Some(obj.holders)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&u64, &NeighborObject)> {
        self.objects.iter()
    }
}
