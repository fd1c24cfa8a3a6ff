//! Potluck+ (§5 baseline): one global threshold tuned online. With probability `p` an
//! approximate hit becomes a verifying miss; if the backend's top-k set equals the
//! cached one the threshold grows (`grow`, default 1.1), else it shrinks (`shrink`,
//! default 0.5). The paper gives no factors: they are parameters, reported by the runner.

use std::sync::atomic::{AtomicU64, Ordering};

use super::HitPolicy;
use crate::entry::{AtomicF32, RepView};

#[derive(Debug)]
pub(crate) struct PotluckPolicy {
    threshold: AtomicF32,
    p: f64,
    grow: f32,
    shrink: f32,
    rng: AtomicU64,
}

impl PotluckPolicy {
    pub(crate) fn new(threshold: f32, p: f64, grow: f32, shrink: f32, seed: u64) -> Self {
        PotluckPolicy {
            threshold: AtomicF32::new(threshold),
            p: p.clamp(0.0, 1.0),
            grow,
            shrink,
            rng: AtomicU64::new(seed | 1),
        }
    }

    #[cfg(test)]
    pub(crate) fn current_threshold(&self) -> f32 {
        self.threshold.load()
    }

    /// xorshift64*, advanced atomically so `&self` suffices.
    fn next_unit(&self) -> f64 {
        let mut x = self.rng.load(Ordering::Relaxed);
        loop {
            let mut y = x;
            y ^= y >> 12;
            y ^= y << 25;
            y ^= y >> 27;
            match self
                .rng
                .compare_exchange_weak(x, y, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    return (y.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64
                        / (1u64 << 53) as f64
                }
                Err(a) => x = a,
            }
        }
    }
}

impl HitPolicy for PotluckPolicy {
    fn name(&self) -> &'static str {
        "potluck"
    }
    fn initial_tau(&self, _min_gap: f32, _kth: Option<(usize, f32)>) -> f32 {
        self.threshold.load()
    }
    fn threshold(&self, _rep: &RepView) -> f32 {
        self.threshold.load()
    }
    fn on_equality_hit(&self, _rep: &RepView) {}
    fn on_approximate_hit(&self, _rep: &RepView) {}
    fn links_aliases(&self) -> bool {
        false
    }
    fn sample_verification(&self) -> bool {
        self.p > 0.0 && self.next_unit() < self.p
    }
    fn on_verification(&self, cached: &[u64], fresh: &[u64]) {
        let mut a = cached.to_vec();
        let mut b = fresh.to_vec();
        a.sort_unstable();
        b.sort_unstable();
        let f = if a == b { self.grow } else { self.shrink };
        self.threshold.update(|t| t * f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verification_grows_on_match_and_shrinks_on_mismatch() {
        let p = PotluckPolicy::new(1.0, 0.1, 1.1, 0.5, 7);
        p.on_verification(&[1, 2, 3], &[3, 2, 1]);
        assert!((p.current_threshold() - 1.1).abs() < 1e-6);
        p.on_verification(&[1, 2, 3], &[1, 2, 4]);
        assert!((p.current_threshold() - 0.55).abs() < 1e-6);
    }

    #[test]
    fn sampling_rate_is_about_p() {
        let p = PotluckPolicy::new(1.0, 0.25, 1.1, 0.5, 42);
        let n = (0..20_000).filter(|_| p.sample_verification()).count();
        assert!((4_500..5_500).contains(&n), "{n}");
    }
}
