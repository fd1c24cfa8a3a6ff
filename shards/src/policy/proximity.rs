//! Proximity+ (§5 baseline): one fixed global threshold (the runner uses the 1st
//! percentile of inter-query distances), no aliases.

use super::HitPolicy;
use crate::entry::RepView;

#[derive(Clone, Copy, Debug)]
pub(crate) struct ProximityPolicy {
    threshold: f32,
}

impl ProximityPolicy {
    pub(crate) fn new(threshold: f32) -> Self {
        ProximityPolicy { threshold }
    }
}

impl HitPolicy for ProximityPolicy {
    fn name(&self) -> &'static str {
        "proximity"
    }
    fn initial_tau(&self, _min_gap: f32, _kth: Option<(usize, f32)>) -> f32 {
        self.threshold
    }
    fn threshold(&self, _rep: &RepView) -> f32 {
        self.threshold
    }
    fn on_equality_hit(&self, _rep: &RepView) {}
    fn on_approximate_hit(&self, _rep: &RepView) {}
    fn links_aliases(&self) -> bool {
        false
    }
}
