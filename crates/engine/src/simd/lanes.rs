//! The vector operations the attention kernels are written in, at two widths: AVX2
//! (eight f32 lanes) and AVX-512 (sixteen). A kernel is written once, generic over
//! [`Lanes`], and instantiated inside a function that enables the width's instructions.
//! Every operation is an exact IEEE operation, one of ggml's or the C library's `expf`
//! ([`super::libm_expf`]), so both widths give the same bits.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use half::f16;

/// The vector operations the kernels need, at one width. Every method is always inlined
/// into a function that enables the width's instructions.
///
/// # Safety
/// Every method may run only where the CPU has the width's instructions: AVX2, FMA and
/// F16C for [`Avx2`], AVX-512F besides for [`Avx512`]. A method taking a pointer needs a
/// whole vector of valid values there.
pub(crate) trait Lanes {
    /// A vector of `WIDTH` f32 lanes.
    type V: Copy;
    /// Lanes per vector.
    const WIDTH: usize;
    /// Vectors per row updated together while adding values (bounded by the registers).
    const VALUE_VECTORS: usize;
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    unsafe fn zero() -> Self::V;
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    unsafe fn splat(x: f32) -> Self::V;
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]), and `p` must reach a whole
    /// vector of readable values.
    unsafe fn load(p: *const f32) -> Self::V;
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]), and `p` must reach a whole
    /// vector of writable values.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]), and `p` must reach a whole
    /// vector of readable values.
    unsafe fn load_f16(p: *const f16) -> Self::V;
    /// Rounds every lane to f16 (nearest, ties to even) and back.
    ///
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    unsafe fn round16(v: Self::V) -> Self::V;
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// ggml's four 16-lane dot product accumulators (`64 / WIDTH` vectors each, one
    /// after another) summed down to eight lanes in `ggml_vec_dot_f16`'s order:
    /// accumulators 0 + 2 and 1 + 3, those two, then the first step of
    /// `_mm512_reduce_add_ps` (the sixteen lanes' halves). [`hsum8`] finishes the sum.
    ///
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    unsafe fn halves64(acc: &[Self::V]) -> __m256;
    /// The sum of ggml's four 16-lane dot product accumulators in `ggml_vec_dot_f16`'s
    /// order: [`Lanes::halves64`], then quarters, pairs, neighbours.
    ///
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    #[inline(always)]
    unsafe fn reduce64(acc: &[Self::V]) -> f32 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { hsum8(Self::halves64(acc)) }
    }
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// The lanes' larger values (for lanes that are not NaN).
    ///
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// The largest lane (of lanes that are not NaN).
    ///
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    unsafe fn hmax(v: Self::V) -> f32;
    /// ggml's AVX-512 `ggml_v_expf` on every lane (bit for bit, at either width; see
    /// [`super::ggml_expf::expf`]).
    ///
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    unsafe fn expf(x: Self::V) -> Self::V;
    /// ggml's AVX2 `ggml_v_expf` on every lane (bit for bit, at either width; see
    /// [`super::ggml_expf::expf_avx2`]).
    ///
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    unsafe fn expf_avx2(x: Self::V) -> Self::V;
    /// `_mm512_reduce_add_ps` of sixteen lanes held in `16 / WIDTH` vectors: halves,
    /// quarters, pairs, neighbours.
    ///
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    unsafe fn sum16(v: &[Self::V]) -> f32;
    /// `WIDTH` keys' steps of a query row's online softmax, given their scaled scores
    /// and the running maximum before them (see [`SoftmaxSteps`]): each key in turn
    /// raises the maximum if its score is greater (a NaN never does), and then weighs 1
    /// and rescales by the C library's `expf(old maximum − score)`; otherwise it weighs
    /// `expf(score − maximum)` and rescales by 1.
    ///
    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    unsafe fn softmax_steps(scores: Self::V, max: f32) -> SoftmaxSteps<Self::V>;
}

/// [`Lanes::softmax_steps`]' result.
pub(crate) struct SoftmaxSteps<V> {
    /// Each key's factor for the accumulator and the sum (1 unless it raised the maximum).
    pub(crate) rescale: V,
    /// Each key's weight (1 where it raised the maximum).
    pub(crate) weight: V,
    /// Bit i set where key i raised the maximum.
    pub(crate) raised: u32,
    /// The running maximum after the last key.
    pub(crate) max: f32,
}

/// A vector of the constant whose f32 bit pattern is `bits`.
///
/// # Safety
/// The CPU must have AVX2: register work only.
#[inline(always)]
unsafe fn c256(bits: u32) -> __m256 {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe { _mm256_set1_ps(f32::from_bits(bits)) }
}

/// A vector of the constant whose f32 bit pattern is `bits`.
///
/// # Safety
/// The CPU must have AVX-512F: register work only.
#[inline(always)]
unsafe fn c512(bits: u32) -> __m512 {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe { _mm512_set1_ps(f32::from_bits(bits)) }
}

/// Four lanes of `j × 2^n` (`n` integral, held as i32), exact in f64 and rounded once to
/// f32: what `_mm512_scalef_ps` gives for exponents within ±192.
///
/// # Safety
/// The CPU must have AVX2: register work only.
#[inline(always)]
unsafe fn scalef4(j: __m128, n: __m128i) -> __m128 {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let wide = _mm256_cvtps_pd(j);
        let n = _mm256_cvtepi32_epi64(n);
        let power = _mm256_slli_epi64::<52>(_mm256_add_epi64(n, _mm256_set1_epi64x(1023)));
        _mm256_cvtpd_ps(_mm256_mul_pd(wide, _mm256_castsi256_pd(power)))
    }
}

/// `hsum_float_8` order: halves, pairs, neighbours.
///
/// # Safety
/// The CPU must have AVX2: register work only.
#[inline(always)]
unsafe fn hsum8(v: __m256) -> f32 {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let r = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
    }
}

/// [`hsum8`] of eight vectors at once: lane `i` of the result is `hsum8(t[i])`, bit for
/// bit (each addition takes its operands in `hsum8`'s order, which decides a NaN's
/// payload). The same additions of the same lanes, arranged across vectors instead of
/// within one: each step adds two shuffles of two vectors, so that there are no horizontal
/// chains, and eight sums cost 22 instructions where eight [`hsum8`] cost 48.
///
/// # Safety
/// AVX2 must be available.
#[inline(always)]
pub(crate) unsafe fn hsum8_each(t: &[__m256; 8]) -> __m256 {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        /// `hsum8`'s halves of vectors a and b: a's in the low 128 bits, b's in the high.
        ///
        /// # Safety
        /// The CPU must have the width's instructions ([`Lanes`]).
        #[inline(always)]
        unsafe fn halves(a: __m256, b: __m256) -> __m256 {
            // SAFETY: the caller upholds this function's safety contract, all that
            // these operations need.
            unsafe {
                _mm256_add_ps(
                    _mm256_permute2f128_ps::<0x31>(a, b),
                    _mm256_permute2f128_ps::<0x20>(a, b),
                )
            }
        }
        /// Pairs: in each 128 bits, elements 0 + 2 and 1 + 3 of x's, then of y's.
        ///
        /// # Safety
        /// The CPU must have the width's instructions ([`Lanes`]).
        #[inline(always)]
        unsafe fn pairs(x: __m256, y: __m256) -> __m256 {
            // SAFETY: the caller upholds this function's safety contract, all that
            // these operations need.
            unsafe {
                _mm256_add_ps(
                    _mm256_shuffle_ps::<0x44>(x, y),
                    _mm256_shuffle_ps::<0xEE>(x, y),
                )
            }
        }
        let w = [
            halves(t[0], t[1]),
            halves(t[2], t[3]),
            halves(t[4], t[5]),
            halves(t[6], t[7]),
        ];
        // r0's low 128 bits hold vectors 0 and 2, its high ones 1 and 3; r1's 4 and 6, 5 and 7.
        let (r0, r1) = (pairs(w[0], w[1]), pairs(w[2], w[3]));
        // Neighbours: elements 0 + 1 and 2 + 3 of each 128 bits of r0, then of r1.
        let sums = _mm256_add_ps(
            _mm256_shuffle_ps::<0x88>(r0, r1),
            _mm256_shuffle_ps::<0xDD>(r0, r1),
        );
        // The low 128 bits hold vectors 0, 2, 4, 6 and the high ones 1, 3, 5, 7.
        _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
}

const F16_ROUNDING: i32 = _MM_FROUND_TO_NEAREST_INT;

/// AVX2, FMA and F16C.
pub(crate) struct Avx2;

impl Lanes for Avx2 {
    type V = __m256;
    const WIDTH: usize = 8;
    const VALUE_VECTORS: usize = 2;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn round16(v: __m256) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm256_cvtph_ps(_mm256_cvtps_ph::<F16_ROUNDING>(v)) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn halves64(a: &[__m256]) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            // Accumulator c's halves are vectors 2c and 2c + 1.
            let lo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
            let hi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
            _mm256_add_ps(lo, hi)
        }
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn hmax(v: __m256) -> f32 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), v);
            lanes.into_iter().fold(f32::NEG_INFINITY, f32::max)
        }
    }
    #[inline(always)]
    unsafe fn expf_avx2(x: __m256) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract.
        unsafe { super::expf_avx2::expf8(x) }
    }
    #[inline(always)]
    unsafe fn expf(x: __m256) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            use super::ggml_expf::consts::*;
            let r = c256(ROUND);
            let z = _mm256_fmadd_ps(x, c256(LOG2E), r);
            let n = _mm256_sub_ps(z, r);
            let b = _mm256_fnmadd_ps(n, c256(LN2_LO), _mm256_fnmadd_ps(n, c256(LN2_HI), x));
            let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
            let d = _mm256_cmp_ps::<_CMP_GT_OQ>(abs, _mm256_set1_ps(LIMIT));
            let u = _mm256_mul_ps(b, b);
            let j = _mm256_fmadd_ps(
                _mm256_fmadd_ps(
                    _mm256_fmadd_ps(c256(C[0]), b, c256(C[1])),
                    u,
                    _mm256_fmadd_ps(c256(C[2]), b, c256(C[3])),
                ),
                u,
                _mm256_fmadd_ps(c256(C[4]), b, _mm256_set1_ps(1.0)),
            );
            // Exponents beyond ±192 are replaced below; clamping keeps the f64 power finite.
            let limit = _mm256_set1_epi32(200);
            let ni = _mm256_min_epi32(
                _mm256_max_epi32(
                    _mm256_cvtps_epi32(n),
                    _mm256_sub_epi32(_mm256_setzero_si256(), limit),
                ),
                limit,
            );
            let lo = scalef4(_mm256_castps256_ps128(j), _mm256_castsi256_si128(ni));
            let hi = scalef4(
                _mm256_extractf128_ps::<1>(j),
                _mm256_extracti128_si256::<1>(ni),
            );
            let res = _mm256_set_m128(hi, lo);
            // NaN stays NaN, as scalef leaves it.
            let res = _mm256_blendv_ps(res, j, _mm256_cmp_ps::<_CMP_UNORD_Q>(n, n));
            let alt = _mm256_blendv_ps(
                _mm256_set1_ps(f32::INFINITY),
                _mm256_setzero_ps(),
                _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps()),
            );
            _mm256_blendv_ps(res, alt, d)
        }
    }
    #[inline(always)]
    unsafe fn sum16(v: &[__m256]) -> f32 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { hsum8(_mm256_add_ps(v[0], v[1])) }
    }
    #[inline(always)]
    unsafe fn softmax_steps(scores: __m256, max: f32) -> SoftmaxSteps<__m256> {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let floor = _mm256_set1_ps(f32::NEG_INFINITY);
            /// Lanes moved up by `K` places, the first `K` from `fill` (`BLEND` = K low bits).
            ///
            /// # Safety
            ///
            /// The CPU has AVX2.
            #[inline(always)]
            unsafe fn up<const K: i32, const BLEND: i32>(v: __m256, fill: __m256) -> __m256 {
                // SAFETY: the caller upholds this function's safety contract, all that
                // these operations need.
                unsafe {
                    let index =
                        _mm256_setr_epi32(0, 1 - K, 2 - K, 3 - K, 4 - K, 5 - K, 6 - K, 7 - K);
                    let index = _mm256_max_epi32(index, _mm256_setzero_si256());
                    _mm256_blend_ps::<BLEND>(_mm256_permutevar8x32_ps(v, index), fill)
                }
            }
            // `maxps(later, earlier)` keeps the earlier of equal values and ignores a NaN in
            // the later, as the scalar "raise only if greater" does; NaN scores become -∞
            // first so that none reaches the earlier operand.
            let mut run = _mm256_max_ps(scores, floor);
            run = _mm256_max_ps(run, up::<1, 0b1>(run, floor));
            run = _mm256_max_ps(run, up::<2, 0b11>(run, floor));
            run = _mm256_max_ps(run, up::<4, 0b1111>(run, floor));
            let m = _mm256_set1_ps(max);
            let run = _mm256_max_ps(run, m);
            let before = up::<1, 0b1>(run, m);
            let raised = _mm256_cmp_ps::<_CMP_GT_OQ>(scores, before);
            let argument = _mm256_blendv_ps(
                _mm256_sub_ps(scores, before),
                _mm256_sub_ps(before, scores),
                raised,
            );
            let e = super::libm_expf::expf8(argument);
            let one = _mm256_set1_ps(1.0);
            SoftmaxSteps {
                rescale: _mm256_blendv_ps(one, e, raised),
                weight: _mm256_blendv_ps(e, one, raised),
                raised: _mm256_movemask_ps(raised) as u32,
                max: _mm256_cvtss_f32(_mm256_permutevar8x32_ps(run, _mm256_set1_epi32(7))),
            }
        }
    }
}

/// AVX-512F (with F16C and FMA).
pub(crate) struct Avx512;

impl Lanes for Avx512 {
    type V = __m512;
    const WIDTH: usize = 16;
    const VALUE_VECTORS: usize = 4;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> __m512 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[inline(always)]
    unsafe fn round16(v: __m512) -> __m512 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm512_cvtph_ps(_mm512_cvtps_ph::<F16_ROUNDING>(v)) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn halves64(a: &[__m512]) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let v = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
            let lo = _mm512_castps512_ps256(v);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            _mm256_add_ps(lo, hi)
        }
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn hmax(v: __m512) -> f32 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm512_reduce_max_ps(v) }
    }
    #[inline(always)]
    unsafe fn expf_avx2(x: __m512) -> __m512 {
        // SAFETY: the caller upholds this function's safety contract.
        unsafe { super::expf_avx2::expf16(x) }
    }
    #[inline(always)]
    unsafe fn expf(x: __m512) -> __m512 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            use super::ggml_expf::consts::*;
            let r = c512(ROUND);
            let z = _mm512_fmadd_ps(x, c512(LOG2E), r);
            let n = _mm512_sub_ps(z, r);
            let b = _mm512_fnmadd_ps(n, c512(LN2_LO), _mm512_fnmadd_ps(n, c512(LN2_HI), x));
            let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(LIMIT));
            let u = _mm512_mul_ps(b, b);
            let j = _mm512_fmadd_ps(
                _mm512_fmadd_ps(
                    _mm512_fmadd_ps(c512(C[0]), b, c512(C[1])),
                    u,
                    _mm512_fmadd_ps(c512(C[2]), b, c512(C[3])),
                ),
                u,
                _mm512_fmadd_ps(c512(C[4]), b, _mm512_set1_ps(1.0)),
            );
            let res = _mm512_scalef_ps(j, n);
            if d == 0 {
                return res;
            }
            let alt = _mm512_mask_blend_ps(
                _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps()),
                _mm512_set1_ps(f32::INFINITY),
                _mm512_setzero_ps(),
            );
            _mm512_mask_blend_ps(d, res, alt)
        }
    }
    #[inline(always)]
    unsafe fn sum16(v: &[__m512]) -> f32 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let lo = _mm512_castps512_ps256(v[0]);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v[0])));
            hsum8(_mm256_add_ps(lo, hi))
        }
    }
    #[inline(always)]
    unsafe fn softmax_steps(scores: __m512, max: f32) -> SoftmaxSteps<__m512> {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let floor = _mm512_set1_ps(f32::NEG_INFINITY);
            /// Lanes moved up by `16 - SHIFT` places, the first ones from `fill`.
            ///
            /// # Safety
            ///
            /// The CPU has AVX-512 F.
            #[inline(always)]
            unsafe fn up<const SHIFT: i32>(v: __m512, fill: __m512) -> __m512 {
                // SAFETY: the caller upholds this function's safety contract, all that
                // these operations need.
                unsafe {
                    let (v, fill) = (_mm512_castps_si512(v), _mm512_castps_si512(fill));
                    _mm512_castsi512_ps(_mm512_alignr_epi32::<SHIFT>(v, fill))
                }
            }
            // As for AVX2: the earlier of equal values, NaN scores as -∞.
            let mut run = _mm512_max_ps(scores, floor);
            run = _mm512_max_ps(run, up::<15>(run, floor));
            run = _mm512_max_ps(run, up::<14>(run, floor));
            run = _mm512_max_ps(run, up::<12>(run, floor));
            run = _mm512_max_ps(run, up::<8>(run, floor));
            let m = _mm512_set1_ps(max);
            let run = _mm512_max_ps(run, m);
            let before = up::<15>(run, m);
            let raised = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(scores, before);
            let argument = _mm512_mask_blend_ps(
                raised,
                _mm512_sub_ps(scores, before),
                _mm512_sub_ps(before, scores),
            );
            let e = super::libm_expf::expf16(argument);
            let one = _mm512_set1_ps(1.0);
            SoftmaxSteps {
                rescale: _mm512_mask_blend_ps(raised, one, e),
                weight: _mm512_mask_blend_ps(raised, e, one),
                raised: raised as u32,
                max: _mm512_cvtss_f32(_mm512_permutexvar_ps(_mm512_set1_epi32(15), run)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::sample::Xorshift;

    /// # Safety
    /// The CPU must have the width's instructions ([`Lanes`]).
    #[target_feature(enable = "avx2")]
    unsafe fn both(t: &[[f32; 8]; 8]) -> ([f32; 8], [f32; 8]) {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let v = t.map(|t| _mm256_loadu_ps(t.as_ptr()));
            let mut each = [0f32; 8];
            _mm256_storeu_ps(each.as_mut_ptr(), hsum8_each(&v));
            (each, v.map(|v| hsum8(v)))
        }
    }

    #[test]
    fn hsum8_each_is_eight_hsum8() {
        if crate::simd::cpu::lacks(is_x86_feature_detected!("avx2"), "AVX2") {
            return;
        }
        let mut rng = Xorshift::new(3);
        for round in 0..2000 {
            // Magnitudes far apart, so that the order of the additions shows in the bits.
            let t: [[f32; 8]; 8] = std::array::from_fn(|_| {
                std::array::from_fn(|_| {
                    let x = (rng.next_f32() - 0.5) * 2f32.powi((rng.next_f32() * 40.0) as i32 - 20);
                    if round % 7 == 0 && rng.next_f32() < 0.1 {
                        f32::NAN
                    } else {
                        x
                    }
                })
            });
            // SAFETY: the CPU has AVX2.
            let (each, one_by_one) = unsafe { both(&t) };
            for (a, b) in each.iter().zip(&one_by_one) {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{t:?}"
                );
            }
        }
    }
}
