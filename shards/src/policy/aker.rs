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
pub(crate) struct AkerPolicy {
    pub alpha_l: f32,
    pub alpha_t: f32,
    pub tau_init_divisor: f32,
    pub rerank: bool,
    /// An alias asked for again is promoted to an entry of its own (`HitPolicy::
    /// promotes_aliases`): the guarded policy.
    pub promote_aliases: bool,
    /// `c > 0`: `τ₀` from the entry's own answer, `minD · c² · ρ · (ln ρ / (2 ln k))²`
    /// with `ρ = d_k / d_1` (gaps): in plain distances a radius `c · r_k · ln(r_k / r_1)
    /// / ln k`, i.e. `c · r_k / D̂` where `D̂ = ln k / ln(r_k / r_1)` is the answer's own
    /// estimate of the local intrinsic dimension (Levina–Bickel). `minD / 4` ignores
    /// how crowded the answer is. 0: the paper's `minD / tau_init_divisor`.
    pub spread: f32,
}

impl Default for AkerPolicy {
    fn default() -> Self {
        AkerPolicy {
            alpha_l: 1.1,
            alpha_t: 0.25,
            tau_init_divisor: 4.0,
            rerank: false,
            promote_aliases: false,
            spread: 0.0,
        }
    }
}

impl HitPolicy for AkerPolicy {
    fn name(&self) -> &'static str {
        match (self.promote_aliases, self.rerank) {
            (true, _) => "guarded",
            (false, true) => "aker-rerank",
            (false, false) => "aker",
        }
    }
    fn initial_tau(&self, min_gap: f32, kth: Option<(usize, f32)>) -> f32 {
        match kth {
            Some((k, kth)) if self.spread > 0.0 && k >= 2 && min_gap > 0.0 && kth > min_gap => {
                let rho = (kth / min_gap) as f64;
                let c = self.spread as f64;
                let radius_share = c * rho.ln() / (2.0 * (k as f64).ln());
                (min_gap as f64 * rho * radius_share * radius_share) as f32
            }
            _ => min_gap / self.tau_init_divisor,
        }
    }
    fn threshold(&self, rep: &RepView) -> f32 {
        rep.state.tau.load()
    }
    fn on_equality_hit(&self, rep: &RepView) {
        // The paper caps growth at minD; a spread start may begin above it, and an
        // equality hit (the same request again) says nothing against it: kept, not cut.
        let spread = self.spread > 0.0;
        let cap = rep.min_gap;
        rep.state.tau.update(|t| {
            let cap = if spread { cap.max(t) } else { cap };
            (t * self.alpha_l).min(cap)
        });
    }
    fn on_approximate_hit(&self, rep: &RepView) {
        rep.state.tau.update(|t| t * self.alpha_t);
    }
    fn links_aliases(&self) -> bool {
        true
    }
    fn rerank(&self) -> bool {
        self.rerank
    }
    fn promotes_aliases(&self) -> bool {
        self.promote_aliases
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_start_follows_the_answer_and_the_divisor_rule_otherwise() {
        let paper = AkerPolicy::default();
        assert_eq!(paper.initial_tau(1.0, Some((10, 4.0))), 0.25, "minD / 4");
        let spread = AkerPolicy {
            spread: 2.0,
            ..AkerPolicy::default()
        };
        // ρ = 4, k = 10, c = 2: minD · ρ · (c ln ρ / (2 ln k))² = 4 · (ln 4 / ln 10)².
        let want = 4.0 * (4f32.ln() / 10f32.ln()).powi(2);
        assert!((spread.initial_tau(1.0, Some((10, 4.0))) - want).abs() < 1e-5);
        // A crowded answer (ρ near 1) starts tight, a spread one wide.
        assert!(
            spread.initial_tau(1.0, Some((10, 1.1))) < spread.initial_tau(1.0, Some((10, 9.0)))
        );
        // No k-th gap, k = 1, or a flat answer: the divisor rule.
        for kth in [None, Some((1, 4.0)), Some((10, 1.0))] {
            assert_eq!(spread.initial_tau(1.0, kth), 0.25, "{kth:?}");
        }
    }
}
