//! Squared-L2 and dot-product kernels for f32 with four independent accumulators.
//!
//! Why not simsimd's for these two: its f32 kernels keep one accumulator, so every
//! fused multiply-add waits for the previous one (4 cycles each); at d = 768 that was
//! 56 ns per distance on this machine's AVX-512 cores, and distances are most of a
//! filter search. Four accumulators let the FMAs overlap. simsimd still serves cosine
//! (its f64 normalisation is worth keeping) and every CPU without AVX2 + FMA.
//! `dot_i8` serves the query filter's int8 codes (`filter/graph.rs`).
//! `tests` below hold these to the scalar reference.

/// Which kernel this CPU runs, found once.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Level {
    Avx512,
    Avx2,
    /// No kernel of ours: the caller uses simsimd.
    None,
}

pub(crate) fn level() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static LEVEL: OnceLock<Level> = OnceLock::new();
        *LEVEL.get_or_init(|| {
            if std::arch::is_x86_feature_detected!("avx512f") {
                Level::Avx512
            } else if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                Level::Avx2
            } else {
                Level::None
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    Level::None
}

/// Squared L2, or `None` where no kernel of ours runs.
#[inline]
pub(crate) fn l2sq(a: &[f32], b: &[f32]) -> Option<f32> {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    match level() {
        // SAFETY: the level says the CPU has these features; pointers cover n floats.
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => Some(unsafe { x86::l2sq_avx512(a.as_ptr(), b.as_ptr(), n) }),
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => Some(unsafe { x86::l2sq_avx2(a.as_ptr(), b.as_ptr(), n) }),
        _ => None,
    }
}

/// Dot product, or `None` where no kernel of ours runs.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> Option<f32> {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    match level() {
        // SAFETY: as in `l2sq`.
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => Some(unsafe { x86::dot_avx512(a.as_ptr(), b.as_ptr(), n) }),
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => Some(unsafe { x86::dot_avx2(a.as_ptr(), b.as_ptr(), n) }),
        _ => None,
    }
}

/// `Σ q_i · c_i` over f32 `q` and int8 codes `c` (the query filter's quantized
/// vectors); scalar where no kernel of ours runs.
#[inline]
pub(crate) fn dot_i8(q: &[f32], c: &[i8]) -> f32 {
    debug_assert_eq!(q.len(), c.len());
    let n = q.len().min(c.len());
    match level() {
        // SAFETY: as in `l2sq`; `c` holds n bytes.
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => unsafe { x86::dot_i8_avx512(q.as_ptr(), c.as_ptr(), n) },
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { x86::dot_i8_avx2(q.as_ptr(), c.as_ptr(), n) },
        _ => dot_i8_scalar(q, c),
    }
}

pub(crate) fn dot_i8_scalar(q: &[f32], c: &[i8]) -> f32 {
    q.iter().zip(c).map(|(x, &y)| x * y as f32).sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// One kernel body per (width, operation): `$step(acc, a, b)` folds one register.
    macro_rules! kernel512 {
        ($name:ident, $step:expr) => {
            #[target_feature(enable = "avx512f")]
            pub(super) unsafe fn $name(a: *const f32, b: *const f32, n: usize) -> f32 {
                let step = $step;
                let mut acc = [_mm512_setzero_ps(); 4];
                let mut i = 0;
                while i + 64 <= n {
                    for (j, acc) in acc.iter_mut().enumerate() {
                        let o = i + 16 * j;
                        *acc = step(*acc, _mm512_loadu_ps(a.add(o)), _mm512_loadu_ps(b.add(o)));
                    }
                    i += 64;
                }
                while i + 16 <= n {
                    acc[0] = step(acc[0], _mm512_loadu_ps(a.add(i)), _mm512_loadu_ps(b.add(i)));
                    i += 16;
                }
                if i < n {
                    // Masked lanes load as zero and add nothing.
                    let mask: __mmask16 = (1u32 << (n - i)) as u16 - 1;
                    let (va, vb) = (
                        _mm512_maskz_loadu_ps(mask, a.add(i)),
                        _mm512_maskz_loadu_ps(mask, b.add(i)),
                    );
                    acc[1] = step(acc[1], va, vb);
                }
                let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
                _mm512_reduce_add_ps(s)
            }
        };
    }

    macro_rules! kernel256 {
        ($name:ident, $step:expr, $scalar:expr) => {
            #[target_feature(enable = "avx2,fma")]
            pub(super) unsafe fn $name(a: *const f32, b: *const f32, n: usize) -> f32 {
                let step = $step;
                let mut acc = [_mm256_setzero_ps(); 4];
                let mut i = 0;
                while i + 32 <= n {
                    for (j, acc) in acc.iter_mut().enumerate() {
                        let o = i + 8 * j;
                        *acc = step(*acc, _mm256_loadu_ps(a.add(o)), _mm256_loadu_ps(b.add(o)));
                    }
                    i += 32;
                }
                while i + 8 <= n {
                    acc[0] = step(acc[0], _mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)));
                    i += 8;
                }
                let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), s);
                let mut total: f32 = lanes.iter().sum();
                let scalar = $scalar;
                while i < n {
                    total += scalar(*a.add(i), *b.add(i));
                    i += 1;
                }
                total
            }
        };
    }

    kernel512!(l2sq_avx512, |acc, va, vb| {
        let d = _mm512_sub_ps(va, vb);
        _mm512_fmadd_ps(d, d, acc)
    });
    kernel512!(dot_avx512, |acc, va, vb| _mm512_fmadd_ps(va, vb, acc));
    kernel256!(
        l2sq_avx2,
        |acc, va, vb| {
            let d = _mm256_sub_ps(va, vb);
            _mm256_fmadd_ps(d, d, acc)
        },
        |x: f32, y: f32| (x - y) * (x - y)
    );
    kernel256!(
        dot_avx2,
        |acc, va, vb| _mm256_fmadd_ps(va, vb, acc),
        |x: f32, y: f32| x * y
    );

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot_i8_avx512(q: *const f32, c: *const i8, n: usize) -> f32 {
        let mut acc = [_mm512_setzero_ps(); 2];
        let mut i = 0;
        let codes = |i: usize| {
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                c.add(i).cast::<__m128i>(),
            )))
        };
        while i + 32 <= n {
            acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(i)), codes(i), acc[0]);
            acc[1] = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(i + 16)), codes(i + 16), acc[1]);
            i += 32;
        }
        while i + 16 <= n {
            acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(i)), codes(i), acc[0]);
            i += 16;
        }
        let mut total = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
        while i < n {
            total += *q.add(i) * *c.add(i) as f32;
            i += 1;
        }
        total
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_i8_avx2(q: *const f32, c: *const i8, n: usize) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut i = 0;
        let codes = |i: usize| {
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                c.add(i).cast::<__m128i>(),
            )))
        };
        while i + 16 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(i)), codes(i), acc[0]);
            acc[1] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(i + 8)), codes(i + 8), acc[1]);
            i += 16;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(i)), codes(i), acc[0]);
            i += 8;
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(acc[0], acc[1]));
        let mut total: f32 = lanes.iter().sum();
        while i < n {
            total += *q.add(i) * *c.add(i) as f32;
            i += 1;
        }
        total
    }

    #[cfg(test)]
    pub(super) fn avx2_available() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(test)]
    pub(super) fn avx512_available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::x86;
    use crate::Metric;

    fn close(got: f32, want: f32) -> bool {
        (got - want).abs() <= 1e-4 * want.abs().max(1.0)
    }

    /// Every length from 0 to 200 (all tails, all loop shapes) and the large ones,
    /// each width this CPU has, against the f64 scalar reference.
    #[test]
    fn kernels_match_the_scalar_reference() {
        let mut seed = 3u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((seed >> 40) as f32) / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        for n in (0..=200).chain([767, 768, 1536, 4099]) {
            let a: Vec<f32> = (0..n).map(|_| next()).collect();
            let b: Vec<f32> = (0..n).map(|_| next()).collect();
            let l2 = Metric::L2Sq.distance_scalar(&a, &b);
            let dot = -Metric::InnerProduct.distance_scalar(&a, &b);
            let codes: Vec<i8> = b.iter().map(|x| (x * 127.0) as i8).collect();
            let dot8 = super::dot_i8_scalar(&a, &codes);
            // SAFETY: features checked; the slices hold n floats (codes: n bytes).
            unsafe {
                if x86::avx512_available() {
                    let got = x86::dot_i8_avx512(a.as_ptr(), codes.as_ptr(), n);
                    assert!(close(got, dot8), "n {n}");
                    assert!(
                        close(x86::l2sq_avx512(a.as_ptr(), b.as_ptr(), n), l2),
                        "n {n}"
                    );
                    assert!(
                        close(x86::dot_avx512(a.as_ptr(), b.as_ptr(), n), dot),
                        "n {n}"
                    );
                }
                if x86::avx2_available() {
                    let got = x86::dot_i8_avx2(a.as_ptr(), codes.as_ptr(), n);
                    assert!(close(got, dot8), "n {n}");
                    assert!(
                        close(x86::l2sq_avx2(a.as_ptr(), b.as_ptr(), n), l2),
                        "n {n}"
                    );
                    assert!(
                        close(x86::dot_avx2(a.as_ptr(), b.as_ptr(), n), dot),
                        "n {n}"
                    );
                }
            }
        }
    }
}
