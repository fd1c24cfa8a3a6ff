//! Epoch-published values: the one place this crate retires memory itself.
//!
//! Reclamation is seize's (the same collector papaya's maps use, so the crate has one
//! reclamation scheme, not two). A reader enters an epoch only inside [`EpochCell::read`]'s
//! closure, which is synchronous: a guard can never be held across an `.await`
//! (glommio tasks are `!Send`, so the compiler would not catch that otherwise).

use std::sync::atomic::{AtomicPtr, Ordering};

use seize::{reclaim, Collector, Guard};

pub struct EpochCell<T> {
    collector: Collector,
    ptr: AtomicPtr<T>,
}

// SAFETY: the cell hands out `&T` to many threads and drops `T` on whichever thread
// reclaims it, so `T` must be both.
unsafe impl<T: Send + Sync> Send for EpochCell<T> {}
// SAFETY: as for `Send`: shared `&T` across threads needs `T: Sync`.
unsafe impl<T: Send + Sync> Sync for EpochCell<T> {}

impl<T> EpochCell<T> {
    pub fn new(value: T) -> Self {
        EpochCell {
            collector: Collector::new(),
            ptr: AtomicPtr::new(Box::into_raw(Box::new(value))),
        }
    }

    /// Runs `f` on the current value; the value cannot be freed while `f` runs.
    #[inline]
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let guard = self.collector.enter();
        let p = guard.protect(&self.ptr, Ordering::Acquire);
        // SAFETY: `p` came from `Box::into_raw` and is retired only through the
        // collector, which waits for this guard.
        f(unsafe { &*p })
    }

    /// Publishes `value`; the old one is freed once no reader can hold it.
    pub fn store(&self, value: T) {
        let old = self
            .ptr
            .swap(Box::into_raw(Box::new(value)), Ordering::AcqRel);
        // SAFETY: `old` is unreachable for new readers; seize defers the free until
        // every guard that could have loaded it is gone.
        unsafe { self.collector.retire(old, reclaim::boxed::<T>) };
    }

    /// Frees every retired value now (tests: what readers' reclamation does at some
    /// later point, made deterministic).
    ///
    /// # Safety
    /// No thread may be inside `read` (seize's `reclaim_all`).
    #[cfg(test)]
    pub(crate) unsafe fn reclaim_all(&self) {
        // SAFETY: forwarded contract.
        unsafe { self.collector.reclaim_all() }
    }
}

impl<T> Drop for EpochCell<T> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader is left; retired values are freed by the
        // collector's own drop.
        unsafe { drop(Box::from_raw(self.ptr.load(Ordering::Acquire))) };
    }
}

/// A fixed number of epoch-published slots, each empty or holding a `T`: the ring of
/// recent inserts readers check at hit time (`recent.rs`). One collector for all slots,
/// so a reader enters one epoch for a whole scan.
pub(crate) struct EpochSlots<T> {
    collector: Collector,
    slots: Box<[AtomicPtr<T>]>,
}

// SAFETY: as for `EpochCell`: `&T` is shared across threads, `T` dropped on any thread.
unsafe impl<T: Send + Sync> Send for EpochSlots<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: Send + Sync> Sync for EpochSlots<T> {}

/// A reader's view of [`EpochSlots`] inside one epoch.
pub(crate) struct SlotsGuard<'a, T> {
    guard: seize::LocalGuard<'a>,
    slots: &'a [AtomicPtr<T>],
}

impl<'a, T> SlotsGuard<'a, T> {
    /// The value in slot `i` (`i < len`), if any.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        let p = self.guard.protect(&self.slots[i], Ordering::Acquire);
        // SAFETY: a non-null `p` came from `Box::into_raw` and is retired only through
        // the collector, which waits for this guard (borrowed for `&self`).
        (!p.is_null()).then(|| unsafe { &*p })
    }
}

impl<T> EpochSlots<T> {
    pub(crate) fn new(len: usize) -> Self {
        EpochSlots {
            collector: Collector::new(),
            slots: (0..len)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Runs `f` with every slot readable; no value it sees is freed while `f` runs.
    #[inline]
    pub(crate) fn read<R>(&self, f: impl FnOnce(&SlotsGuard<'_, T>) -> R) -> R {
        let guard = SlotsGuard {
            guard: self.collector.enter(),
            slots: &self.slots,
        };
        f(&guard)
    }

    /// Puts `value` in slot `i`; what it held is freed once no reader can hold it.
    pub(crate) fn store(&self, i: usize, value: T) {
        let old = self.slots[i].swap(Box::into_raw(Box::new(value)), Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: `old` is unreachable for new readers; seize defers the free until
            // every guard that could have loaded it is gone.
            unsafe { self.collector.retire(old, reclaim::boxed::<T>) };
        }
    }
}

impl<T> Drop for EpochSlots<T> {
    fn drop(&mut self) {
        for s in self.slots.iter() {
            let p = s.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: `&mut self`: no reader is left.
                unsafe { drop(Box::from_raw(p)) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn readers_see_whole_values_while_a_writer_publishes() {
        let cell = Arc::new(EpochCell::new(vec![0u64; 64]));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (cell, stop) = (cell.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) && n < 5_000_000 {
                        cell.read(|v| {
                            let first = v[0];
                            assert!(v.iter().all(|&x| x == first), "torn value");
                        });
                        n += 1;
                    }
                })
            })
            .collect();
        for i in 1..20_000u64 {
            cell.store(vec![i; 64]);
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
        cell.read(|v| assert_eq!(v[0], 19_999));
    }
}
