//! The paper's policy (§4.4, Eq. 1): per-entry `τ`, initialised to `minD / 4`, grown by
//! `α_L` on equality hits (capped by `minD`), shrunk by `α_T` on approximate hits.

use super::HitPolicy;
use crate::entry::RepView;

#[derive(Clone, Copy, Debug)]
pub struct AkerPolicy {
    pub alpha_l: f32,
    pub alpha_t: f32,
    pub tau_init_divisor: f32,
}

impl Default for AkerPolicy {
    fn default() -> Self {
        AkerPolicy {
            alpha_l: 1.1,
            alpha_t: 0.25,
            tau_init_divisor: 4.0,
        }
    }
}

impl HitPolicy for AkerPolicy {
    fn name(&self) -> &'static str {
        "aker"
    }
    fn initial_tau(&self, min_d: f32) -> f32 {
        min_d / self.tau_init_divisor
    }
    fn threshold(&self, rep: &RepView) -> f32 {
        rep.tau.load()
    }
    fn on_equality_hit(&self, rep: &RepView) {
        let cap = rep.min_d();
        rep.tau.update(|t| (t * self.alpha_l).min(cap));
    }
    fn on_approximate_hit(&self, rep: &RepView) {
        rep.tau.update(|t| t * self.alpha_t);
    }
    fn links_aliases(&self) -> bool {
        true
    }
}
