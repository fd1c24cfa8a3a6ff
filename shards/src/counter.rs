//! Striped counters: many cores bump them on the hit path, so each thread adds to its
//! own cache line and readers of STATS sum the stripes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

const STRIPES: usize = 8;

#[derive(Debug, Default)]
pub struct Counter([CachePadded<AtomicU64>; STRIPES]);

fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

impl Counter {
    #[inline]
    pub fn add(&self, n: u64) {
        self.0[stripe()].fetch_add(n, Ordering::Relaxed);
    }
    #[inline]
    pub fn bump(&self) {
        self.add(1)
    }
    pub fn get(&self) -> u64 {
        self.0.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}
