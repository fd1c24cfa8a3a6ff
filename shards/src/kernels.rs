//! Squared-L2 and dot-product kernels for f32 with four independent accumulators.
//!
//! Why not simsimd's for these two: its f32 kernels keep one accumulator, so every
//! fused multiply-add waits for the previous one (4 cycles each); at d = 768 that was
//! 56 ns per distance on this machine's AVX-512 cores, and distances are most of a
//! filter search. Four accumulators let the FMAs overlap. simsimd still serves cosine
//! (its f64 normalisation is worth keeping) and every CPU without AVX2 + FMA.
//! `dot_i8i8` serves the query filter's int8 codes (`filter/graph.rs`).
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
            // bw for the int8 kernel (every avx512f CPU but Knights Landing has it).
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
            {
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

/// Bytes of a slice `prefetch` asks for at most.
const PREFETCH_BYTES: usize = 4096;

/// Asks the CPU to start loading `v` (its first 4 KB) into cache, so that several
/// vectors' loads overlap instead of each waiting in turn: the query filter prefetches a
/// node's unvisited neighbours' rows together (at d = 768 a row is 13 cache lines, and
/// waiting for each in turn was most of a search).
#[inline]
pub(crate) fn prefetch<T>(v: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = std::mem::size_of_val(v).min(PREFETCH_BYTES);
        let p = v.as_ptr().cast::<i8>();
        let mut off = 0;
        while off < bytes {
            // SAFETY: a prefetch never faults, and off < the slice's size anyway.
            unsafe { _mm_prefetch(p.add(off), _MM_HINT_T0) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = v;
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
        // SAFETY: as for the AVX-512 arm.
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
        // SAFETY: as for the AVX-512 arm.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => Some(unsafe { x86::dot_avx2(a.as_ptr(), b.as_ptr(), n) }),
        _ => None,
    }
}

/// `Σ a_i · b_i` over two int8 codes (the query filter's quantized vectors, query and
/// node alike): products widened to i16 pairs and summed in i32, exact. |sum| stays
/// below 2^31 for any length up to 2^17 (each term is at most 127² = 16,129).
#[inline]
pub(crate) fn dot_i8i8(a: &[i8], b: &[i8]) -> i32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    match level() {
        // SAFETY: as in `l2sq`; both hold n bytes.
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => unsafe { x86::dot_i8i8_avx512(a.as_ptr(), b.as_ptr(), n) },
        // SAFETY: as for the AVX-512 arm.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { x86::dot_i8i8_avx2(a.as_ptr(), b.as_ptr(), n) },
        _ => dot_i8i8_scalar(&a[..n], &b[..n]),
    }
}

/// Symmetric int8 quantization: writes `round(v_i / scale)` into `out` and returns
/// `scale = max |v_i| / 127` (0 for the zero vector, whose code is all zeros). Rounding
/// is to nearest, ties to even, on every path. `v` must be finite.
pub(crate) fn quantize_i8(v: &[f32], out: &mut [i8]) -> f32 {
    assert_eq!(v.len(), out.len());
    match level() {
        // SAFETY: as in `l2sq`; both hold v.len() elements.
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => unsafe { x86::quantize_i8_avx512(v, out) },
        // SAFETY: as for the AVX-512 arm.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { x86::quantize_i8_avx2(v, out) },
        _ => quantize_i8_scalar(v, out),
    }
}

fn scale_of(max_abs: f32) -> (f32, f32) {
    if max_abs > 0.0 {
        (max_abs / 127.0, 127.0 / max_abs)
    } else {
        (0.0, 0.0)
    }
}

pub(crate) fn quantize_i8_scalar(v: &[f32], out: &mut [i8]) -> f32 {
    let max_abs = v
        .iter()
        .fold(0f32, |m, &x| if x.abs() > m { x.abs() } else { m });
    let (scale, inv) = scale_of(max_abs);
    for (c, &x) in out.iter_mut().zip(v) {
        *c = (x * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    scale
}

pub(crate) fn dot_i8i8_scalar(a: &[i8], b: &[i8]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// One kernel body per (width, operation): `$step(acc, a, b)` folds one register.
    macro_rules! kernel512 {
        ($name:ident, $step:expr) => {
            #[target_feature(enable = "avx512f")]
            pub(super) unsafe fn $name(a: *const f32, b: *const f32, n: usize) -> f32 {
                // SAFETY: the caller (the dispatch above) ran the CPU check for this
                // function's target features, and its pointers cover `n` elements.
                unsafe {
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
                    let s =
                        _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
                    _mm512_reduce_add_ps(s)
                }
            }
        };
    }

    macro_rules! kernel256 {
        ($name:ident, $step:expr, $scalar:expr) => {
            #[target_feature(enable = "avx2,fma")]
            pub(super) unsafe fn $name(a: *const f32, b: *const f32, n: usize) -> f32 {
                // SAFETY: the caller (the dispatch above) ran the CPU check for this
                // function's target features, and its pointers cover `n` elements.
                unsafe {
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
                    let s =
                        _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
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

    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn dot_i8i8_avx512(a: *const i8, b: *const i8, n: usize) -> i32 {
        // SAFETY: the caller (the dispatch above) ran the CPU check for this
        // function's target features, and its pointers (slices) cover `n` elements.
        unsafe {
            // 32 bytes sign-extended to 32 i16; madd multiplies and adds pairs into 16 i32.
            let wide = |p: *const i8| _mm512_cvtepi8_epi16(_mm256_loadu_si256(p.cast::<__m256i>()));
            let mut acc = [_mm512_setzero_si512(); 2];
            let mut i = 0;
            while i + 64 <= n {
                acc[0] =
                    _mm512_add_epi32(acc[0], _mm512_madd_epi16(wide(a.add(i)), wide(b.add(i))));
                acc[1] = _mm512_add_epi32(
                    acc[1],
                    _mm512_madd_epi16(wide(a.add(i + 32)), wide(b.add(i + 32))),
                );
                i += 64;
            }
            while i + 32 <= n {
                acc[0] =
                    _mm512_add_epi32(acc[0], _mm512_madd_epi16(wide(a.add(i)), wide(b.add(i))));
                i += 32;
            }
            let mut total = _mm512_reduce_add_epi32(_mm512_add_epi32(acc[0], acc[1]));
            while i < n {
                total += *a.add(i) as i32 * *b.add(i) as i32;
                i += 1;
            }
            total
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot_i8i8_avx2(a: *const i8, b: *const i8, n: usize) -> i32 {
        // SAFETY: the caller (the dispatch above) ran the CPU check for this
        // function's target features, and its pointers (slices) cover `n` elements.
        unsafe {
            let wide = |p: *const i8| _mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast::<__m128i>()));
            let mut acc = [_mm256_setzero_si256(); 2];
            let mut i = 0;
            while i + 32 <= n {
                acc[0] =
                    _mm256_add_epi32(acc[0], _mm256_madd_epi16(wide(a.add(i)), wide(b.add(i))));
                acc[1] = _mm256_add_epi32(
                    acc[1],
                    _mm256_madd_epi16(wide(a.add(i + 16)), wide(b.add(i + 16))),
                );
                i += 32;
            }
            while i + 16 <= n {
                acc[0] =
                    _mm256_add_epi32(acc[0], _mm256_madd_epi16(wide(a.add(i)), wide(b.add(i))));
                i += 16;
            }
            let mut lanes = [0i32; 8];
            _mm256_storeu_si256(
                lanes.as_mut_ptr().cast::<__m256i>(),
                _mm256_add_epi32(acc[0], acc[1]),
            );
            let mut total: i32 = lanes.iter().sum();
            while i < n {
                total += *a.add(i) as i32 * *b.add(i) as i32;
                i += 1;
            }
            total
        }
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn quantize_i8_avx512(v: &[f32], out: &mut [i8]) -> f32 {
        // SAFETY: the caller (the dispatch above) ran the CPU check for this
        // function's target features, and its pointers (slices) cover `n` elements.
        unsafe {
            let (n, p) = (v.len(), v.as_ptr());
            let mut m = _mm512_setzero_ps();
            let mut i = 0;
            while i + 16 <= n {
                m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(p.add(i))));
                i += 16;
            }
            let mut max_abs = _mm512_reduce_max_ps(m);
            for &x in &v[i..] {
                max_abs = if x.abs() > max_abs { x.abs() } else { max_abs };
            }
            let (scale, inv) = super::scale_of(max_abs);
            let vinv = _mm512_set1_ps(inv);
            let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
            let mut i = 0;
            while i + 16 <= n {
                let x = _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), vinv);
                // cvtps rounds to nearest even (the default MXCSR mode); the clamp keeps
                // float slop from reaching 128.
                let q = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(x, lo), hi));
                _mm_storeu_si128(out.as_mut_ptr().add(i).cast(), _mm512_cvtsepi32_epi8(q));
                i += 16;
            }
            for (c, &x) in out[i..].iter_mut().zip(&v[i..]) {
                *c = (x * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
            }
            scale
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_i8_avx2(v: &[f32], out: &mut [i8]) -> f32 {
        // SAFETY: the caller (the dispatch above) ran the CPU check for this
        // function's target features, and its pointers (slices) cover `n` elements.
        unsafe {
            let (n, p) = (v.len(), v.as_ptr());
            let sign = _mm256_set1_ps(-0.0);
            let mut m = _mm256_setzero_ps();
            let mut i = 0;
            while i + 8 <= n {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(i))));
                i += 8;
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), m);
            let mut max_abs = 0f32;
            for &x in lanes.iter().chain(&v[i..]) {
                max_abs = if x.abs() > max_abs { x.abs() } else { max_abs };
            }
            let (scale, inv) = super::scale_of(max_abs);
            let vinv = _mm256_set1_ps(inv);
            let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
            let conv = |j: usize| {
                let x = _mm256_mul_ps(_mm256_loadu_ps(p.add(j)), vinv);
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(x, lo), hi))
            };
            // packs interleave 128-bit lanes; the permute puts the 32 bytes back in order.
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let mut i = 0;
            while i + 32 <= n {
                let ab = _mm256_packs_epi32(conv(i), conv(i + 8));
                let cd = _mm256_packs_epi32(conv(i + 16), conv(i + 24));
                let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
                _mm256_storeu_si256(out.as_mut_ptr().add(i).cast(), bytes);
                i += 32;
            }
            for (c, &x) in out[i..].iter_mut().zip(&v[i..]) {
                *c = (x * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
            }
            scale
        }
    }

    #[cfg(test)]
    pub(super) fn avx2_available() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(test)]
    pub(super) fn avx512_available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
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
            let codes_a: Vec<i8> = a.iter().map(|x| (x * 127.0) as i8).collect();
            let codes: Vec<i8> = b.iter().map(|x| (x * 127.0) as i8).collect();
            let dot8 = super::dot_i8i8_scalar(&codes_a, &codes);
            let mut q_ref = vec![0i8; n];
            let scale_ref = super::quantize_i8_scalar(&a, &mut q_ref);
            // Extremes too: the i16 pair sums must not saturate.
            let (lo, hi) = (vec![-127i8; n], vec![127i8; n]);
            let extreme = -(127 * 127 * n as i32);
            // SAFETY: features checked; the slices hold n floats (codes: n bytes).
            unsafe {
                if x86::avx512_available() {
                    let got = x86::dot_i8i8_avx512(codes_a.as_ptr(), codes.as_ptr(), n);
                    assert_eq!(got, dot8, "n {n}");
                    assert_eq!(x86::dot_i8i8_avx512(lo.as_ptr(), hi.as_ptr(), n), extreme);
                    let mut q = vec![0i8; n];
                    assert_eq!(x86::quantize_i8_avx512(&a, &mut q), scale_ref, "n {n}");
                    assert_eq!(q, q_ref, "n {n}");
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
                    let got = x86::dot_i8i8_avx2(codes_a.as_ptr(), codes.as_ptr(), n);
                    assert_eq!(got, dot8, "n {n}");
                    assert_eq!(x86::dot_i8i8_avx2(lo.as_ptr(), hi.as_ptr(), n), extreme);
                    let mut q = vec![0i8; n];
                    assert_eq!(x86::quantize_i8_avx2(&a, &mut q), scale_ref, "n {n}");
                    assert_eq!(q, q_ref, "n {n}");
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
