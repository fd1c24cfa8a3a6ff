//! Hit policies: when a near query may reuse a cached answer, and how thresholds learn.
//! One file per policy; the cache calls them only through [`HitPolicy`].
//!
//! - [`AkerPolicy`]: per-entry thresholds (§4.4), the paper's algorithm.
//! - [`ProximityPolicy`]: Proximity+, one fixed global threshold, no aliases.
//! - [`PotluckPolicy`]: Potluck+, one global threshold tuned by sampled verification.
//!
//! The trait is shaped for richer policies: `rerank` lets a policy return the best `k`
//! of the cached `k + Δ` for the request's own vector, and `on_verification` feeds back
//! whether a reused answer matched the backend's.

mod aker;
mod potluck;
mod proximity;

pub(crate) use aker::AkerPolicy;
pub(crate) use potluck::PotluckPolicy;
pub(crate) use proximity::ProximityPolicy;

use serde::{Deserialize, Serialize};

use crate::entry::RepView;

pub trait HitPolicy: Send + Sync {
    fn name(&self) -> &'static str;
    /// `τ` of a newly admitted entry, given its `minD` and `(k, the gap to its k-th
    /// result)`, both in the thresholds' unit (`RepView::min_gap`, `Gauge::kth_gap`; the
    /// latter `None` on `ip` without the results' vectors).
    fn initial_tau(&self, min_gap: f32, kth: Option<(usize, f32)>) -> f32;
    /// A query whose gap to `rep.query` is `g` (`gap.rs`: the metric's distance, the
    /// angular `1 − cos` on `ip`) is an approximate hit iff `g < threshold`.
    fn threshold(&self, rep: &RepView) -> f32;
    /// After an equality hit on `rep`.
    fn on_equality_hit(&self, rep: &RepView);
    /// After an approximate hit on `rep`.
    fn on_approximate_hit(&self, rep: &RepView);
    /// Whether approximate hits link an alias for the query (§4.2 entry linking).
    fn links_aliases(&self) -> bool;
    /// Whether this approximate hit should be turned into a verifying miss.
    fn sample_verification(&self) -> bool {
        false
    }
    /// The backend's answer to a verifying miss, against the cached one (ids, top-k).
    fn on_verification(&self, _cached: &[u64], _fresh: &[u64]) {}
    /// Whether an alias, once asked for again, stops serving its representative's
    /// answer: the request becomes a miss whose answer is admitted as the query's own
    /// entry (the alias marks a near query worth caching exactly).
    fn promotes_aliases(&self) -> bool {
        false
    }
    /// Whether hits return the best `k` of all `k + Δ` cached results for the request's
    /// vector (needs stored vectors) instead of the entry's own first `k`.
    fn rerank(&self) -> bool {
        false
    }
}

/// Serializable choice of policy, for configs and the experiment runner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum PolicyConfig {
    Aker {
        alpha_l: f32,
        alpha_t: f32,
        tau_init_divisor: f32,
    },
    /// Aker's thresholds, and near queries get the best `k` of all `k + Δ` cached
    /// results for their own vector (needs `store_vectors` and `Δ > 0`).
    AkerRerank {
        alpha_l: f32,
        alpha_t: f32,
        tau_init_divisor: f32,
    },
    /// Aker's threshold rules with guarded reuse (beyond the paper): an alias asked for
    /// again is promoted to an entry of its own instead of serving its representative's
    /// approximate answer for ever (`HitPolicy::promotes_aliases`).
    Guarded {
        alpha_l: f32,
        alpha_t: f32,
        tau_init_divisor: f32,
        /// `> 0`: τ₀ from the spread of the entry's own answer instead of `minD /
        /// tau_init_divisor` (`AkerPolicy::spread`); 0: the divisor rule.
        #[serde(default)]
        spread: f32,
    },
    Proximity {
        threshold: f32,
    },
    Potluck {
        threshold: f32,
        p: f64,
        grow: f32,
        shrink: f32,
        seed: u64,
    },
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig::Aker {
            alpha_l: 1.1,
            alpha_t: 0.25,
            tau_init_divisor: 4.0,
        }
    }
}

impl PolicyConfig {
    /// The paper's policy with re-ranking over the reserve.
    pub fn aker_rerank() -> Self {
        PolicyConfig::AkerRerank {
            alpha_l: 1.1,
            alpha_t: 0.25,
            tau_init_divisor: 4.0,
        }
    }

    /// Whether the factors and thresholds make sense for `metric`: Aker's factors grow
    /// (`α_L ≥ 1`, divisor ≥ 1) and shrink (`0 < α_T ≤ 1`); a global threshold is a
    /// gap (`gap.rs`), finite and non-negative, at most 2 on `cosine` and `ip` (an
    /// angle `1 − cos`); Potluck+'s `p` is a probability.
    pub fn validate(&self, metric: crate::Metric) -> Result<(), String> {
        let threshold = |t: f32| {
            let most = if metric == crate::Metric::L2Sq {
                f32::INFINITY
            } else {
                2.0
            };
            if t.is_finite() && (0.0..=most).contains(&t) {
                Ok(())
            } else {
                Err(format!(
                    "policy threshold {t} is not a gap in [0, {most}] for {metric}"
                ))
            }
        };
        match *self {
            PolicyConfig::Guarded { spread, .. } if !(spread.is_finite() && spread >= 0.0) => Err(
                format!("guarded policy: spread must be finite and >= 0 (got {spread})"),
            ),
            PolicyConfig::Aker {
                alpha_l,
                alpha_t,
                tau_init_divisor,
            }
            | PolicyConfig::AkerRerank {
                alpha_l,
                alpha_t,
                tau_init_divisor,
            }
            | PolicyConfig::Guarded {
                alpha_l,
                alpha_t,
                tau_init_divisor,
                ..
            } => {
                let grows = alpha_l.is_finite() && alpha_l >= 1.0;
                let shrinks = alpha_t > 0.0 && alpha_t <= 1.0;
                let divides = tau_init_divisor.is_finite() && tau_init_divisor >= 1.0;
                if !(grows && shrinks && divides) {
                    return Err(format!(
                        "aker policy: alpha_l >= 1, 0 < alpha_t <= 1, tau_init_divisor >= 1 \
                         (got {alpha_l}, {alpha_t}, {tau_init_divisor})"
                    ));
                }
                Ok(())
            }
            PolicyConfig::Proximity { threshold: t } => threshold(t),
            PolicyConfig::Potluck {
                threshold: t,
                p,
                grow,
                shrink,
                ..
            } => {
                threshold(t)?;
                let probability = (0.0..=1.0).contains(&p);
                let grows = grow.is_finite() && grow >= 1.0;
                let shrinks = shrink > 0.0 && shrink <= 1.0;
                if !(probability && grows && shrinks) {
                    return Err(format!(
                        "potluck policy: 0 <= p <= 1, grow >= 1, 0 < shrink <= 1 \
                         (got {p}, {grow}, {shrink})"
                    ));
                }
                Ok(())
            }
        }
    }

    pub fn build(&self) -> Box<dyn HitPolicy> {
        match *self {
            PolicyConfig::Aker {
                alpha_l,
                alpha_t,
                tau_init_divisor,
            } => Box::new(AkerPolicy {
                alpha_l,
                alpha_t,
                tau_init_divisor,
                rerank: false,
                promote_aliases: false,
                spread: 0.0,
            }),
            PolicyConfig::AkerRerank {
                alpha_l,
                alpha_t,
                tau_init_divisor,
            } => Box::new(AkerPolicy {
                alpha_l,
                alpha_t,
                tau_init_divisor,
                rerank: true,
                promote_aliases: false,
                spread: 0.0,
            }),
            PolicyConfig::Guarded {
                alpha_l,
                alpha_t,
                tau_init_divisor,
                spread,
            } => Box::new(AkerPolicy {
                alpha_l,
                alpha_t,
                tau_init_divisor,
                rerank: false,
                promote_aliases: true,
                spread,
            }),
            PolicyConfig::Proximity { threshold } => Box::new(ProximityPolicy::new(threshold)),
            PolicyConfig::Potluck {
                threshold,
                p,
                grow,
                shrink,
                seed,
            } => Box::new(PotluckPolicy::new(threshold, p, grow, shrink, seed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Metric;

    #[test]
    fn thresholds_are_gaps_and_factors_move_the_right_way() {
        assert!(PolicyConfig::default()
            .validate(Metric::InnerProduct)
            .is_ok());
        let prx = |threshold| PolicyConfig::Proximity { threshold };
        assert!(prx(5.0).validate(Metric::L2Sq).is_ok());
        assert!(
            prx(5.0).validate(Metric::Cosine).is_err(),
            "an angle is at most 2"
        );
        assert!(
            prx(-0.5).validate(Metric::InnerProduct).is_err(),
            "a -dot threshold"
        );
        assert!(prx(f32::NAN).validate(Metric::L2Sq).is_err());
        let backwards = PolicyConfig::Aker {
            alpha_l: 1.1,
            alpha_t: 2.0,
            tau_init_divisor: 4.0,
        };
        assert!(
            backwards.validate(Metric::L2Sq).is_err(),
            "α_T must tighten"
        );
        let potluck = PolicyConfig::Potluck {
            threshold: 0.1,
            p: 1.5,
            grow: 1.1,
            shrink: 0.5,
            seed: 1,
        };
        assert!(
            potluck.validate(Metric::Cosine).is_err(),
            "p is a probability"
        );
        let guarded = |spread| PolicyConfig::Guarded {
            alpha_l: 1.1,
            alpha_t: 0.25,
            tau_init_divisor: 4.0,
            spread,
        };
        assert!(guarded(2.0).validate(Metric::L2Sq).is_ok());
        assert!(
            guarded(f32::INFINITY).validate(Metric::L2Sq).is_err(),
            "every request a hit"
        );
        assert!(guarded(-1.0).validate(Metric::L2Sq).is_err());
    }
}
