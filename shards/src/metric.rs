//! Distances. Squared L2 and inner product run our four-accumulator kernels
//! (`kernels.rs`: simsimd's f32 ones are latency-bound) where the CPU has AVX2 + FMA or
//! AVX-512, cosine and every other CPU run simsimd; the scalar versions are the
//! reference both are tested against (and the fallback when simsimd declines, which it
//! only does on a length mismatch).
//!
//! Units (ALGORITHM.md, "Units and terms"): squared L2 (no square root anywhere),
//! cosine as `1 - cos`, inner product as `-dot`. Smaller is always closer, and every
//! threshold is in the metric's own unit.

use serde::{Deserialize, Serialize};
use simsimd::SpatialSimilarity;

/// In configs and files a metric is its short name (`l2sq`, `cosine`, `ip`); every
/// spelling `FromStr` knows is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "&'static str")]
pub enum Metric {
    /// Squared Euclidean distance.
    L2Sq,
    /// `1 - cos(a, b)`; 1 when either vector is zero.
    Cosine,
    /// `-dot(a, b)`.
    InnerProduct,
}

impl TryFrom<String> for Metric {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Metric> for &'static str {
    fn from(m: Metric) -> &'static str {
        m.name()
    }
}

impl Metric {
    /// The distance from `a` to `b` with the SIMD kernel.
    #[inline]
    pub fn distance(self, a: &[f32], b: &[f32]) -> f32 {
        debug_assert_eq!(
            a.len(),
            b.len(),
            "distance over vectors of different dimension"
        );
        let ours = match self {
            Metric::L2Sq => crate::kernels::l2sq(a, b),
            Metric::InnerProduct => crate::kernels::dot(a, b).map(|d| -d),
            Metric::Cosine => None,
        };
        if let Some(d) = ours {
            return d;
        }
        let simd = match self {
            Metric::L2Sq => <f32 as SpatialSimilarity>::l2sq(a, b),
            Metric::Cosine => <f32 as SpatialSimilarity>::cos(a, b),
            Metric::InnerProduct => <f32 as SpatialSimilarity>::dot(a, b).map(|d| -d),
        };
        match simd {
            Some(d) => d as f32,
            None => self.distance_scalar(a, b),
        }
    }

    /// Plain scalar reference, accumulated in f64.
    pub fn distance_scalar(self, a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        match self {
            Metric::L2Sq => (0..n)
                .map(|i| {
                    let d = a[i] as f64 - b[i] as f64;
                    d * d
                })
                .sum::<f64>() as f32,
            Metric::InnerProduct => -(0..n).map(|i| a[i] as f64 * b[i] as f64).sum::<f64>() as f32,
            Metric::Cosine => {
                let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
                for i in 0..n {
                    ab += a[i] as f64 * b[i] as f64;
                    aa += a[i] as f64 * a[i] as f64;
                    bb += b[i] as f64 * b[i] as f64;
                }
                if aa == 0.0 && bb == 0.0 {
                    0.0
                } else if aa == 0.0 || bb == 0.0 {
                    1.0
                } else {
                    (1.0 - ab / (aa.sqrt() * bb.sqrt())) as f32
                }
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Metric::L2Sq => "l2sq",
            Metric::Cosine => "cosine",
            Metric::InnerProduct => "ip",
        }
    }

    /// Wire / config code.
    pub fn code(self) -> u8 {
        match self {
            Metric::L2Sq => 0,
            Metric::Cosine => 1,
            Metric::InnerProduct => 2,
        }
    }

    pub fn from_code(code: u8) -> Option<Metric> {
        match code {
            0 => Some(Metric::L2Sq),
            1 => Some(Metric::Cosine),
            2 => Some(Metric::InnerProduct),
            _ => None,
        }
    }
}

impl std::str::FromStr for Metric {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "l2sq" | "l2" | "euclidean" | "sqeuclidean" => Ok(Metric::L2Sq),
            "cosine" | "cos" => Ok(Metric::Cosine),
            "ip" | "dot" | "inner_product" | "innerproduct" => Ok(Metric::InnerProduct),
            other => Err(format!("unknown metric '{other}' (l2sq, cosine, ip)")),
        }
    }
}

impl std::fmt::Display for Metric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() <= 1e-3 * (1.0 + a.abs().max(b.abs()))
    }

    #[test]
    fn hand_computed() {
        let a = [1.0, 2.0, 3.0];
        let b = [4.0, 6.0, 3.0];
        assert!(close(Metric::L2Sq.distance(&a, &b), 25.0));
        assert!(close(
            Metric::InnerProduct.distance(&a, &b),
            -(4.0 + 12.0 + 9.0)
        ));
        let c = [1.0, 0.0];
        let d = [0.0, 1.0];
        assert!(close(Metric::Cosine.distance(&c, &d), 1.0));
        assert!(close(Metric::Cosine.distance(&c, &c), 0.0));
    }

    proptest! {
        #[test]
        fn simd_matches_scalar(v in proptest::collection::vec((-10f32..10.0, -10f32..10.0), 1..300)) {
            let (a, b): (Vec<f32>, Vec<f32>) = v.into_iter().unzip();
            for m in [Metric::L2Sq, Metric::Cosine, Metric::InnerProduct] {
                let (s, r) = (m.distance(&a, &b), m.distance_scalar(&a, &b));
                prop_assert!((s - r).abs() <= 1e-3 * (1.0 + r.abs()), "{m}: simd {s} scalar {r}");
            }
        }
    }
}
