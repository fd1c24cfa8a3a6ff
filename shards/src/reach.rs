//! The insert fast path's reach: the largest `maxD` over the live representatives.
//!
//! A vector farther than that from every representative cannot enter any list, so the
//! fast path's filter search may stop there (`DualFilter::nearest_taker`'s bound) instead
//! of walking every generation for a nearest representative that would refuse it. A
//! counted multiset, because lists change (merges, delete repairs) and entries leave: a
//! running maximum would only ever grow.

use std::collections::BTreeMap;

#[derive(Debug, Default)]
pub(crate) struct MaxDistances {
    /// Order-preserving bits of each live list's `maxD` -> how many lists end there.
    counts: BTreeMap<u32, u32>,
}

/// f32 -> u32 preserving the order of finite values (negatives flip, positives get the
/// top bit), so the map's last key is the largest distance.
fn key(d: f32) -> u32 {
    let b = d.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

fn value(k: u32) -> f32 {
    f32::from_bits(if k >> 31 == 1 { k & 0x7fff_ffff } else { !k })
}

impl MaxDistances {
    pub(crate) fn add(&mut self, d: f32) {
        *self.counts.entry(key(d)).or_insert(0) += 1;
    }

    /// Removes one list ending at `d`; it must have been added.
    pub(crate) fn remove(&mut self, d: f32) {
        let k = key(d);
        let c = self
            .counts
            .get_mut(&k)
            .expect("a list's maxD is removed as it was added");
        *c -= 1;
        if *c == 0 {
            self.counts.remove(&k);
        }
    }

    pub(crate) fn replace(&mut self, old: f32, new: f32) {
        if key(old) != key(new) {
            self.remove(old);
            self.add(new);
        }
    }

    /// The largest `maxD`; `None` with no live list.
    pub(crate) fn max(&self) -> Option<f32> {
        self.counts.last_key_value().map(|(&k, _)| value(k))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maximum_follows_adds_and_removes() {
        let mut m = MaxDistances::default();
        assert_eq!(m.max(), None);
        for d in [1.5, -2.0, 0.0, 3.25, 3.25, -0.5] {
            m.add(d);
        }
        assert_eq!(m.max(), Some(3.25));
        m.remove(3.25);
        assert_eq!(
            m.max(),
            Some(3.25),
            "one of two lists ending at 3.25 is left"
        );
        m.remove(3.25);
        assert_eq!(m.max(), Some(1.5));
        m.replace(1.5, -1.0);
        assert_eq!(m.max(), Some(0.0));
        for d in [0.0, -0.5, -1.0, -2.0] {
            m.remove(d);
        }
        assert!(m.is_empty());
        // Order of keys over signs and magnitudes.
        let xs = [-1e30f32, -3.0, -1e-30, 0.0, 1e-30, 2.0, 1e30];
        assert!(xs.windows(2).all(|w| key(w[0]) < key(w[1])));
        assert!(xs.iter().all(|&x| value(key(x)) == x));
    }
}
