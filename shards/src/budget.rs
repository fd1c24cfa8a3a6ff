//! The global pool budget (ARCHITECTURE.md): one budget for all shards, each shard's
//! share following its admissions. A share proportional to a shard's admission rate
//! gives every shard about the same FIFO residence time, which is what one global
//! FIFO would give; an even split loses hit ratio under skew (ALGORITHM.md: 4-6 points).
//!
//! The rebalance bookkeeping sits behind a mutex: control plane, never on a lookup.
#![allow(clippy::disallowed_types)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crossbeam_utils::CachePadded;

use crate::counter::Counter;

pub struct GlobalBudget {
    total: usize,
    /// Smallest share, as a fraction of an even split, so an idle shard can restart.
    floor_fraction: f64,
    shares: Vec<CachePadded<AtomicUsize>>,
    admissions: Vec<Counter>,
    /// Admission counts at the last rebalance. Control plane only: `share` and
    /// `record_admission` never touch it.
    seen: Mutex<Vec<u64>>,
}

impl GlobalBudget {
    pub fn new(total: usize, shards: usize) -> Self {
        assert!(shards > 0);
        GlobalBudget {
            total,
            floor_fraction: 0.25,
            shares: (0..shards)
                .map(|_| CachePadded::new(AtomicUsize::new(total / shards)))
                .collect(),
            admissions: (0..shards).map(|_| Counter::default()).collect(),
            seen: Mutex::new(vec![0; shards]),
        }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn shards(&self) -> usize {
        self.shares.len()
    }

    /// The shard's current share, in the budget's unit.
    pub fn share(&self, shard: usize) -> usize {
        self.shares[shard].load(Ordering::Relaxed)
    }

    /// Every shard's share (a warm restart's image).
    pub fn shares(&self) -> Vec<u64> {
        self.shares
            .iter()
            .map(|s| s.load(Ordering::Relaxed) as u64)
            .collect()
    }

    /// Shares from an image; ignored (false) unless there is one per shard and they
    /// stay within the total.
    pub fn set_shares(&self, shares: &[u64]) -> bool {
        let sum: u128 = shares.iter().map(|&s| s as u128).sum();
        if shares.len() != self.shares.len() || sum > self.total as u128 {
            return false;
        }
        for (s, &v) in self.shares.iter().zip(shares) {
            s.store(v as usize, Ordering::Relaxed);
        }
        true
    }

    pub fn record_admission(&self, shard: usize) {
        self.admissions[shard].bump();
    }

    /// Recomputes shares from the admissions since the last call; no-op without any.
    pub fn rebalance(&self) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let now: Vec<u64> = self.admissions.iter().map(|c| c.get()).collect();
        let recent: Vec<u64> = now.iter().zip(seen.iter()).map(|(n, s)| n - s).collect();
        let sum: u64 = recent.iter().sum();
        if sum == 0 {
            return;
        }
        let s = self.shares.len();
        let floor = ((self.total as f64 / s as f64) * self.floor_fraction) as usize;
        let spread = self.total.saturating_sub(floor * s);
        for (i, share) in self.shares.iter().enumerate() {
            let v = floor + (spread as f64 * recent[i] as f64 / sum as f64) as usize;
            share.store(v, Ordering::Relaxed);
        }
        debug_assert!(
            self.shares
                .iter()
                .map(|x| x.load(Ordering::Relaxed))
                .sum::<usize>()
                <= self.total
        );
        *seen = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_admissions_and_never_exceed_the_total() {
        let b = GlobalBudget::new(1000, 4);
        assert_eq!((0..4).map(|s| b.share(s)).collect::<Vec<_>>(), vec![250; 4]);
        for _ in 0..70 {
            b.record_admission(0);
        }
        for _ in 0..10 {
            b.record_admission(1);
            b.record_admission(2);
            b.record_admission(3);
        }
        b.rebalance();
        let shares: Vec<usize> = (0..4).map(|s| b.share(s)).collect();
        assert!(shares[0] > 500 && shares[1] >= 62, "{shares:?}");
        assert!(shares.iter().sum::<usize>() <= 1000);
        b.rebalance(); // nothing new: unchanged
        assert_eq!((0..4).map(|s| b.share(s)).collect::<Vec<_>>(), shares);
    }
}
