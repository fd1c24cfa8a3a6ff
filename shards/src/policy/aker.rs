//! The paper's policy (§4.4, Eq. 1): per-entry `τ`, initialised to `minD / 4`, grown by
//! `α_L` on equality hits (capped by `minD`), shrunk by `α_T` on approximate hits.
//!
//! With `rerank`, a near query gets the best `k` of the entry's `k + Δ` results for its
//! own vector instead of the entry's own first `k`: the reserve that deletes need is
//! also where a near query's true neighbours most often are (ALGORITHM.md: paper-Aker's
//! approximate hits are individually poor).

use super::HitPolicy;
use crate::entry::RepView;

#[derive(Clone, Copy, Debug)]
pub struct AkerPolicy {
    pub alpha_l: f32,
    pub alpha_t: f32,
    pub tau_init_divisor: f32,
    pub rerank: bool,
}

impl Default for AkerPolicy {
    fn default() -> Self {
        AkerPolicy {
            alpha_l: 1.1,
            alpha_t: 0.25,
            tau_init_divisor: 4.0,
            rerank: false,
        }
    }
}

impl HitPolicy for AkerPolicy {
    fn name(&self) -> &'static str {
        if self.rerank {
            "aker-rerank"
        } else {
            "aker"
        }
    }
    fn initial_tau(&self, min_d: f32) -> f32 {
        min_d / self.tau_init_divisor
    }
    fn threshold(&self, rep: &RepView) -> f32 {
        rep.tau.load()
    }
    fn on_equality_hit(&self, rep: &RepView) {
        let cap = rep.min_gap;
        rep.tau.update(|t| (t * self.alpha_l).min(cap));
    }
    fn on_approximate_hit(&self, rep: &RepView) {
        rep.tau.update(|t| t * self.alpha_t);
    }
    fn links_aliases(&self) -> bool {
        true
    }
    fn rerank(&self) -> bool {
        self.rerank
    }
}
