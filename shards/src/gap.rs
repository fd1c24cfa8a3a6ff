//! The unit every hit threshold lives in: the *gap* between a request and a cached
//! query, a non-negative dissimilarity that is 0 at `q = RQ` for every metric.
//!
//! - `l2sq`, `cosine`: the metric's own distance (squared L2, `1 − cos`), as in the paper.
//! - `ip` (`−dot`, negative, with no natural zero): the gap is the *angular* one,
//!   `1 − cos(q, RQ)`, because a top-k by inner product depends only on the request's
//!   direction (scaling `q` by `c > 0` scales every score by `c`). A representative's
//!   `minD` for its thresholds is likewise angular: the smallest angle `1 − cos(RQ, r_i)`
//!   to one of its results. On unit vectors the best score is the smallest angle, so
//!   the gap, `minD` and the risk factor all equal cosine's.
//!
//! Why that is safe when vectors are not normalised: `minD` plays the paper's part, the
//! local density around `RQ`, in angles; a request turned by a fraction of it (`τ ≤
//! minD`, from `minD / 4`) stays among the directions the answer was computed for.
//! Long vectors win inner products over wide angles, so the best result's own angle
//! (tried first) overstates that density (raw GloVe: recall 0.89 at a 1% pool); the
//! smallest angle to any result is never larger, and equal on unit vectors. The
//! learning rules (`α_T` after every approximate hit) only tighten it. An answer lacking
//! a result vector gets `minD = 0`: under paper-Aker, exact and alias hits only.
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

/// `v / |v|`, divided in f64; a zero vector (or one whose norm overflows) gives zeros.
pub(crate) fn unit(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if n > 0.0 && n.is_finite() {
        v.iter().map(|&x| (x as f64 / n) as f32).collect()
    } else {
        vec![0.0; v.len()]
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

    /// `minD` in the threshold unit for a representative at `rq` whose list holds
    /// `results` (metric distance, vector if known), nearest first: the first distance
    /// on `l2sq` / `cosine`; on `ip` the smallest angle `1 − cos(RQ, v)` to a result,
    /// computed from the vectors (not from the reported scores, which a cache-aside
    /// client supplies), `None` unless every result has one (the caller keeps what it
    /// knew, or 0: a subset's minimum could only be looser).
    pub fn min_gap<'a>(
        self,
        rq: &[f32],
        results: impl IntoIterator<Item = (f32, Option<&'a [f32]>)>,
    ) -> Option<f32> {
        let mut results = results.into_iter();
        if !self.angular() {
            return Some(results.next().map_or(0.0, |(d, _)| d));
        }
        let mut min: Option<f32> = None;
        for (_, v) in results {
            let a = Metric::Cosine.distance(rq, v?).clamp(0.0, 2.0);
            min = Some(min.map_or(a, |m| m.min(a)));
        }
        min
    }

    /// An answer's `(minD, gap to its k-th result)` at admission, each angle computed
    /// once: [`Gauge::min_gap`], and for policies that read the answer's spread the `k`-th
    /// distance on `l2sq` / `cosine`, on `ip` the `k`-th smallest angle to a result
    /// (both `None` on `ip` unless every vector is known).
    pub fn answer_gaps<'a>(
        self,
        rq: &[f32],
        k: usize,
        results: impl IntoIterator<Item = (f32, Option<&'a [f32]>)>,
    ) -> (Option<f32>, Option<f32>) {
        let mut gaps: Vec<f32> = Vec::new();
        for (d, v) in results {
            if !self.angular() {
                gaps.push(d);
                continue;
            }
            let Some(v) = v else { return (None, None) };
            gaps.push(Metric::Cosine.distance(rq, v).clamp(0.0, 2.0));
        }
        if self.angular() {
            gaps.sort_by(f32::total_cmp);
        }
        // As `min_gap`: 0 for an empty list but on `ip`, which knows no angle then.
        let min = match gaps.first() {
            Some(&g) => Some(g),
            None if self.angular() => None,
            None => Some(0.0),
        };
        (min, k.checked_sub(1).and_then(|i| gaps.get(i).copied()))
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

    /// Risk factor `r(e)` of a list with distances `dists`, vectors `vectors` (either may
    /// be absent) and `k` answered, for a representative with `|RQ| = rq_norm`:
    /// `d_k / d_(k+Δ)` (the paper's); on `ip`, where distances are negative, the same
    /// ratio measured from the lowest distance the list's vectors allow, `−|RQ| · max |r_i|`
    /// (Cauchy–Schwarz; on unit vectors this is cosine's ratio exactly), or, with no
    /// vector known, from `d_1 − |d_1|`, below `d_1` whatever its sign. 1 without a reserve.
    pub fn risk_factor(
        self,
        dists: &[f32],
        vectors: &[Option<Arc<[f32]>>],
        k: usize,
        rq_norm: f32,
    ) -> f64 {
        if dists.len() <= k || k == 0 {
            return 1.0;
        }
        let zero = if self.angular() {
            let longest = vectors.iter().flatten().map(|v| norm(v)).reduce(f32::max);
            let d1 = dists[0] as f64;
            match longest {
                Some(m) if m > 0.0 => (-(rq_norm as f64) * m as f64).min(d1),
                _ => d1 - d1.abs(),
            }
        } else {
            0.0
        };
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
        let (rq, v1, v2) = ([2.0, 0.0], [4.0, 4.0], [1.0, 0.1]);
        let m = g.min_gap(&rq, [(-8.0, Some(&v1[..]))]).unwrap();
        assert!(close(m, 1.0 - std::f32::consts::FRAC_1_SQRT_2));
        let both = g.min_gap(&rq, [(-8.0, Some(&v1[..])), (-2.0, Some(&v2[..]))]);
        assert!(close(both.unwrap(), 1.0 - 1.0 / 1.01f32.sqrt()));
        // A reported score does not change the angle; a missing vector gives none.
        let lying = g.min_gap(&rq, [(5.0, Some(&v1[..]))]).unwrap();
        assert!(close(lying, m));
        assert_eq!(g.min_gap(&rq, [(-8.0, Some(&v1[..])), (-2.0, None)]), None);
        // On l2sq and cosine, minD is the first distance itself.
        let l2 = Gauge(Metric::L2Sq).min_gap(&rq, [(0.5, None), (0.7, None)]);
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
    fn ip_risk_is_measured_from_the_lowest_distance_the_vectors_allow() {
        let g = Gauge(Metric::InnerProduct);
        let v = |x: f32, y: f32| Some(Arc::<[f32]>::from(vec![x, y]));
        // |RQ| = 2, longest result 5: floor -10. Distances -8, -6, -4; k = 1: 2 / 6.
        let vs = [v(4.0, 0.0), v(3.0, 4.0), v(0.0, 2.0)];
        let r = g.risk_factor(&[-8.0, -6.0, -4.0], &vs, 1, 2.0);
        assert!((r - 2.0 / 6.0).abs() < 1e-9, "{r}");
        // No vectors: from d_1 - |d_1| = -16: k = 1 gives 8 / 12, never 0.
        let r = g.risk_factor(&[-8.0, -6.0, -4.0], &[None, None, None], 1, 2.0);
        assert!((r - 8.0 / 12.0).abs() < 1e-9, "{r}");
        let r = Gauge(Metric::L2Sq).risk_factor(&[1.0, 2.0, 3.0, 4.0], &[], 2, 1.0);
        assert!((r - 0.5).abs() < 1e-9);
        assert_eq!(g.risk_factor(&[-3.0, -2.0], &[], 2, 1.0), 1.0);
    }

    #[test]
    fn on_unit_vectors_ip_risk_is_cosines() {
        // RQ and results unit: cosine's d = 1 - cos, ip's d = -cos.
        let unit = |deg: f32| {
            Some(Arc::<[f32]>::from(vec![
                deg.to_radians().cos(),
                deg.to_radians().sin(),
            ]))
        };
        let vs = [unit(5.0), unit(20.0), unit(40.0)];
        let cos: Vec<f32> = [5.0f32, 20.0, 40.0]
            .iter()
            .map(|d| d.to_radians().cos())
            .collect();
        let ip: Vec<f32> = cos.iter().map(|c| -c).collect();
        let cosine: Vec<f32> = cos.iter().map(|c| 1.0 - c).collect();
        for k in [1, 2] {
            let a = Gauge(Metric::InnerProduct).risk_factor(&ip, &vs, k, 1.0);
            let b = Gauge(Metric::Cosine).risk_factor(&cosine, &vs, k, 1.0);
            assert!((a - b).abs() < 1e-6, "k {k}: ip {a} cosine {b}");
        }
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
