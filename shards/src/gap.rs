//! The unit every hit threshold lives in: the *gap* between a request and a cached
//! query, a non-negative dissimilarity that is 0 at `q = RQ` for every metric.
//!
//! - `l2sq`, `cosine`: the metric's own distance (squared L2, `1 − cos`), as in the paper.
//! - `ip` (`−dot`, negative, with no natural zero): the gap is the *angular* one,
//!   `1 − cos(q, RQ)`, because a top-k by inner product depends only on the request's
//!   direction (scaling `q` by `c > 0` scales every score by `c`). A representative's
//!   `minD` for its thresholds is likewise angular: the smallest angle `1 − cos(RQ, r_i)`
//!   to one of its results. On unit vectors the best score is the smallest angle, so
//!   both equal cosine's and `ip` there behaves exactly as `cosine` does.
//!
//! Why that is safe when vectors are not normalised: `minD` plays the paper's part, the
//! local density around `RQ`, in angles; a request turned by a fraction of it (`τ ≤
//! minD`, from `minD / 4`) stays among the directions the answer was computed for.
//! Long vectors win inner products over wide angles, so the best result's own angle
//! (tried first) overstates that density (raw GloVe: recall 0.89 at a 1% pool); the
//! smallest angle to any result is never larger, and equal on unit vectors. The
//! learning rules (`α_T` after every approximate hit) only tighten it. With no result
//! vector known, an entry gets `minD = 0`: no approximate hits, only exact and alias ones.
//!
//! For `ip` the query filter indexes the *directions* of cached queries (`RQ / |RQ|`)
//! and lookups search it with `q / |q|`: its distance is then `−cos`, which orders
//! candidates by angle (on raw vectors the largest dot product favours long `RQ`s).
//! The insert fast path searches the same index with the raw vector `x`, where the
//! index distance is `−dot(x, RQ) / |RQ|`; a representative takes `x` iff that is below
//! its `maxD / |RQ|` ([`Gauge::filter_max_d`]).

use std::borrow::Cow;
use std::sync::Arc;

use crate::metric::Metric;

/// The metric's threshold unit and the filter's view of vectors (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gauge(pub Metric);

/// `|v|`, accumulated in f64.
pub fn norm(v: &[f32]) -> f32 {
    v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt() as f32
}

fn unit(v: &[f32]) -> Vec<f32> {
    let n = norm(v);
    if n > 0.0 {
        v.iter().map(|&x| x / n).collect()
    } else {
        v.to_vec()
    }
}

impl Gauge {
    /// Whether the filter indexes directions instead of the vectors themselves.
    pub fn angular(self) -> bool {
        self.0 == Metric::InnerProduct
    }

    /// What a lookup searches the filter with for request `q`.
    pub fn filter_query(self, q: &[f32]) -> Cow<'_, [f32]> {
        if self.angular() {
            Cow::Owned(unit(q))
        } else {
            Cow::Borrowed(q)
        }
    }

    /// The point the filter stores for cached query `rq`.
    pub fn filter_point(self, rq: &Arc<[f32]>) -> Arc<[f32]> {
        if self.angular() {
            Arc::from(unit(rq))
        } else {
            rq.clone()
        }
    }

    /// The filter's distance from `fq` (a [`Gauge::filter_query`]) to the point stored
    /// for `rq`, whose norm is `rq_norm`: computed from `rq` itself, so readers need no
    /// second copy of the vector.
    pub fn filter_distance(self, fq: &[f32], rq: &[f32], rq_norm: f32) -> f32 {
        let d = self.0.distance(fq, rq);
        if !self.angular() {
            d
        } else if rq_norm > 0.0 {
            d / rq_norm
        } else {
            0.0
        }
    }

    /// The gap of a lookup's filter distance `df` (threshold unit).
    pub fn gap(self, df: f32) -> f32 {
        if self.angular() {
            // `df` is −cos(q, RQ); float error can step just outside [−1, 1].
            (1.0 + df).clamp(0.0, 2.0)
        } else {
            df
        }
    }

    /// The gap between `a` and `b` (any two vectors: Proximity+'s percentile).
    pub fn gap_between(self, a: &[f32], b: &[f32]) -> f32 {
        if self.angular() {
            Metric::Cosine.distance(a, b).clamp(0.0, 2.0)
        } else {
            self.0.distance(a, b)
        }
    }

    /// `minD` in the threshold unit for a representative (`|RQ| = rq_norm`) whose list
    /// holds `results` (metric distance, vector if known), nearest first: the first
    /// distance on `l2sq` / `cosine`; on `ip` the smallest angle to a result whose vector
    /// is known, `None` when none is (the caller keeps what it knew, or 0).
    pub fn min_gap<'a>(
        self,
        rq_norm: f32,
        results: impl IntoIterator<Item = (f32, Option<&'a [f32]>)>,
    ) -> Option<f32> {
        let mut results = results.into_iter();
        if !self.angular() {
            return Some(results.next().map_or(0.0, |(d, _)| d));
        }
        results
            .filter_map(|(d, v)| Some(self.angle(rq_norm, d, v?)))
            .reduce(f32::min)
    }

    /// `1 − cos(RQ, v)` from `−dot(RQ, v) = d`.
    fn angle(self, rq_norm: f32, d: f32, v: &[f32]) -> f32 {
        let vn = norm(v);
        if rq_norm > 0.0 && vn > 0.0 {
            (1.0 + d / (rq_norm * vn)).clamp(0.0, 2.0)
        } else {
            1.0
        }
    }

    /// A list's `maxD` in the filter's unit (what the fast path compares its filter
    /// distance with, and what bounds its search).
    pub fn filter_max_d(self, max_d: f32, rq_norm: f32) -> f32 {
        if !self.angular() {
            max_d
        } else if rq_norm > 0.0 {
            max_d / rq_norm
        } else {
            // A zero `RQ`: every filter distance is 0 and its list's distances are 0.
            0.0
        }
    }

    /// Risk factor `r(e)` of a list with distances `dists` and `k` answered:
    /// `d_k / d_(k+Δ)` (the paper's), on `ip` the same ratio measured from the list's
    /// own best score, `(d_k − d_1) / (d_(k+Δ) − d_1)` (negative distances make the
    /// plain ratio meaningless); 1 without a reserve.
    pub fn risk_factor(self, dists: &[f32], k: usize) -> f64 {
        if dists.len() <= k || k == 0 {
            return 1.0;
        }
        let zero = if self.angular() { dists[0] as f64 } else { 0.0 };
        let dk = dists[k - 1] as f64 - zero;
        let dlast = *dists.last().expect("longer than k") as f64 - zero;
        if dlast <= 0.0 {
            1.0
        } else {
            (dk / dlast).clamp(0.0, 1.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() < 1e-5
    }

    #[test]
    fn ip_gap_is_the_angle_whatever_the_norms() {
        let g = Gauge(Metric::InnerProduct);
        let rq: Arc<[f32]> = Arc::from(vec![3.0, 0.0]);
        let q = [0.0, 5.0]; // 90 degrees away, any length
        let fq = g.filter_query(&q);
        let df = g.filter_distance(&fq, &rq, norm(&rq));
        assert!(close(g.gap(df), 1.0));
        // Same direction, different length: gap 0.
        let df = g.filter_distance(&g.filter_query(&[7.0, 0.0]), &rq, 3.0);
        assert!(close(g.gap(df), 0.0));
        // The filter's point is the direction; its distance to the query agrees.
        let p = g.filter_point(&rq);
        assert!(close(
            Metric::InnerProduct.distance(&fq, &p),
            df_of(&fq, &rq)
        ));
        assert!(close(g.gap_between(&q, &rq), 1.0));
    }

    fn df_of(fq: &[f32], rq: &[f32]) -> f32 {
        Gauge(Metric::InnerProduct).filter_distance(fq, rq, norm(rq))
    }

    #[test]
    fn ip_min_gap_is_the_smallest_angle_to_a_result() {
        let g = Gauge(Metric::InnerProduct);
        // RQ = (2, 0). r_1 = (4, 4): dot 8, |r_1| 4√2 -> cos = 1/√2; r_2 = (1, 0.1),
        // dot 2, nearly RQ's direction.
        let (v1, v2) = ([4.0, 4.0], [1.0, 0.1]);
        let m = g.min_gap(2.0, [(-8.0, Some(&v1[..]))]).unwrap();
        assert!(close(m, 1.0 - std::f32::consts::FRAC_1_SQRT_2));
        let both = g.min_gap(2.0, [(-8.0, Some(&v1[..])), (-2.0, Some(&v2[..]))]);
        assert!(close(both.unwrap(), 1.0 - 1.0 / 1.01f32.sqrt()));
        assert_eq!(g.min_gap(2.0, [(-8.0, None)]), None);
        // On l2sq and cosine, minD is the first distance itself.
        let l2 = Gauge(Metric::L2Sq).min_gap(2.0, [(0.5, None), (0.7, None)]);
        assert_eq!(l2, Some(0.5));
    }

    #[test]
    fn gaps_are_never_negative() {
        for m in [Metric::L2Sq, Metric::Cosine, Metric::InnerProduct] {
            let g = Gauge(m);
            let a: Arc<[f32]> = Arc::from(vec![1.0, -2.0, 0.5]);
            let b = [-3.0, 1.0, 2.0];
            let fq = g.filter_query(&b);
            assert!(g.gap(g.filter_distance(&fq, &a, norm(&a))) >= 0.0, "{m}");
            assert!(g.gap_between(&a, &b) >= 0.0, "{m}");
        }
    }

    #[test]
    fn ip_risk_is_measured_from_the_best_score() {
        let g = Gauge(Metric::InnerProduct);
        // Scores 10, 9, 8, 6 -> distances -10, -9, -8, -6; k = 2: (1) / (4).
        let r = g.risk_factor(&[-10.0, -9.0, -8.0, -6.0], 2);
        assert!((r - 0.25).abs() < 1e-9);
        let r = Gauge(Metric::L2Sq).risk_factor(&[1.0, 2.0, 3.0, 4.0], 2);
        assert!((r - 0.5).abs() < 1e-9);
        assert_eq!(g.risk_factor(&[-3.0, -2.0], 2), 1.0);
    }

    #[test]
    fn ip_fast_path_bound_matches_the_exact_test() {
        // A representative takes x iff -dot(x, RQ) < maxD; the filter sees
        // -dot(x, RQ/|RQ|) and compares with maxD / |RQ|.
        let g = Gauge(Metric::InnerProduct);
        let rq: Arc<[f32]> = Arc::from(vec![0.0, 4.0]);
        let p = g.filter_point(&rq);
        for (x, max_d) in [([1.0, 2.0], -7.0), ([1.0, 2.0], -9.0), ([5.0, -1.0], 5.0)] {
            let exact = Metric::InnerProduct.distance(&x, &rq) < max_d;
            let filtered = Metric::InnerProduct.distance(&x, &p) < g.filter_max_d(max_d, 4.0);
            assert_eq!(exact, filtered, "{x:?} {max_d}");
        }
    }
}
