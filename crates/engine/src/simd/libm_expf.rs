//! The C library's `expf` on a vector of lanes, bit for bit: what `f32::exp` (and
//! llama.cpp's scalar `expf`) gives with glibc 2.27 or later on an x86-64 CPU with FMA.
//! Other C libraries with the same table-driven algorithm (musl, from Arm's
//! optimized-routines) compile it without fused multiply-adds and may differ in a last
//! bit; the tests, which compare with `f32::exp`, would say so.
//!
//! Row attention calls `expf` once per query row and key, and the sampler once per token
//! of the vocabulary ([`super::exp_in_place`]). As a scalar library call that
//! was about a seventh of the row kernel's time on a Zen 4; eight or sixteen lanes at a
//! time it is a small fraction of that. The algorithm, in double precision:
//! `x · 32/ln 2 = k + r` (k rounded to an integer by adding 1.5 · 2^52, r in [−½, ½]),
//! then `exp(x) = 2^(k/32) · 2^(r/32)`, the first factor a table entry whose exponent
//! field is shifted by k, the second a cubic in r; the product is rounded to f32 once.
//! The operations and their fusing are those of glibc's `__expf_fma` (the variant its
//! dispatch picks on a CPU with FMA), read from its machine code: `k` and `r` each one
//! fused multiply-add, the cubic three.
//!
//! Lanes whose argument is 88 or more in magnitude, +∞ or NaN take glibc's special cases
//! (overflow, underflow, the smallest subnormal for arguments just below the underflow
//! threshold): they go to `f32::exp` itself, one lane at a time. Attention meets them only
//! for keys whose scores differ by 88 or more; the sampler meets them for tokens whose
//! logits, over the temperature, lie 88 or more below the best (most of a vocabulary at a
//! low temperature, where this runs no faster than the scalar call). −∞, which attention
//! meets at every row's first key and in the lanes past a block's last, gives 0 in the
//! vector.
//!
//! The tests compare both widths with `f32::exp` on every 97th f32 bit pattern and on
//! the special cases' boundaries; an ignored one compares every f32.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

/// 32 / ln 2, the scale taking `x` to table steps (`InvLn2N`).
const INV_LN2_N: f64 = f64::from_bits(0x4047_1547_652b_82fe);
/// 1.5 · 2^52: added to round to an integer held in the low mantissa bits.
const SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);
/// The cubic's coefficients for r³, r², r (scaled for 32 steps per octave).
const C: [f64; 3] = [
    f64::from_bits(0x3ebc_6af8_4b91_2394),
    f64::from_bits(0x3f2e_bfce_50fa_c4f3),
    f64::from_bits(0x3f96_2e42_ff0c_52d6),
];

/// `2^(i/32)` rounded to the nearest double, with `i << 47` subtracted from its bits so
/// that adding `k << 47` (k's low five bits being `i`) puts `k / 32` into the exponent.
static TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// −∞'s bits, as an i32: its `expf` is 0.
const MINUS_INF: i32 = 0xff80_0000u32 as i32;

/// Bits of `|x|` from which `expf` takes its special cases: `|x| >= 88` (glibc's
/// `top12(x) >= top12(88)`), infinities and NaN included.
const SPECIAL_FROM: u32 = 0x42b0_0000;

/// Lanes of `out` whose argument in `x` (same lanes) is special, recomputed by the
/// library (`mask` bit i set for lane i).
#[inline(always)]
fn fix_special(x: &[f32], out: &mut [f32], mut mask: u32) {
    while mask != 0 {
        let i = mask.trailing_zeros() as usize;
        out[i] = x[i].exp();
        mask &= mask - 1;
    }
}

/// The lanes whose argument needs a special case (bit i for lane i).
///
/// # Safety
///
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn special_mask512(x: __m512) -> u32 {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let abs = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fff_ffff));
        _mm512_cmpge_epu32_mask(abs, _mm512_set1_epi32(SPECIAL_FROM as i32)) as u32
    }
}

/// The main path on eight lanes, in AVX-512.
///
/// # Safety
///
/// The CPU has AVX2, FMA and AVX-512 F (and VL).
#[inline(always)]
unsafe fn main_path512(x: __m256) -> __m256 {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let xd = _mm512_cvtps_pd(x);
        let kd = _mm512_fmadd_pd(xd, _mm512_set1_pd(INV_LN2_N), _mm512_set1_pd(SHIFT));
        let ki = _mm512_castpd_si512(kd);
        let kd = _mm512_sub_pd(kd, _mm512_set1_pd(SHIFT));
        let r = _mm512_fmsub_pd(xd, _mm512_set1_pd(INV_LN2_N), kd);
        let t = TABLE.as_ptr() as *const __m512i;
        let low =
            _mm512_permutex2var_epi64(_mm512_loadu_si512(t), ki, _mm512_loadu_si512(t.add(1)));
        let high = _mm512_permutex2var_epi64(
            _mm512_loadu_si512(t.add(2)),
            ki,
            _mm512_loadu_si512(t.add(3)),
        );
        let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
        let entry = _mm512_mask_blend_epi64(upper, low, high);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(entry, _mm512_slli_epi64::<47>(ki)));
        let z = _mm512_fmadd_pd(r, _mm512_set1_pd(C[0]), _mm512_set1_pd(C[1]));
        let r2 = _mm512_mul_pd(r, r);
        let y = _mm512_fmadd_pd(r, _mm512_set1_pd(C[2]), _mm512_set1_pd(1.0));
        let y = _mm512_fmadd_pd(z, r2, y);
        _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
    }
}

/// `expf` of sixteen lanes, bit for bit the C library's.
///
/// # Safety
/// AVX-512F must be available.
#[inline(always)]
pub(crate) unsafe fn expf16(x: __m512) -> __m512 {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let lo = _mm512_castps512_ps256(x);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
        let out = _mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(main_path512(lo))),
            _mm256_castps_pd(main_path512(hi)),
        );
        let minus_inf =
            _mm512_cmpeq_epi32_mask(_mm512_castps_si512(x), _mm512_set1_epi32(MINUS_INF));
        let mut out = _mm512_mask_blend_ps(minus_inf, _mm512_castpd_ps(out), _mm512_setzero_ps());
        let special = special_mask512(x) & !u32::from(minus_inf);
        if special != 0 {
            let (mut xs, mut outs) = ([0f32; 16], [0f32; 16]);
            _mm512_storeu_ps(xs.as_mut_ptr(), x);
            _mm512_storeu_ps(outs.as_mut_ptr(), out);
            fix_special(&xs, &mut outs, special);
            out = _mm512_loadu_ps(outs.as_ptr());
        }
        out
    }
}

/// The main path on four lanes, in AVX2.
///
/// # Safety
///
/// The CPU has AVX2 and FMA.
#[inline(always)]
unsafe fn main_path256(x: __m128) -> __m128 {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let xd = _mm256_cvtps_pd(x);
        let kd = _mm256_fmadd_pd(xd, _mm256_set1_pd(INV_LN2_N), _mm256_set1_pd(SHIFT));
        let ki = _mm256_castpd_si256(kd);
        let kd = _mm256_sub_pd(kd, _mm256_set1_pd(SHIFT));
        let r = _mm256_fmsub_pd(xd, _mm256_set1_pd(INV_LN2_N), kd);
        let index = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
        let entry = _mm256_i64gather_epi64::<8>(TABLE.as_ptr() as *const i64, index);
        let s = _mm256_castsi256_pd(_mm256_add_epi64(entry, _mm256_slli_epi64::<47>(ki)));
        let z = _mm256_fmadd_pd(r, _mm256_set1_pd(C[0]), _mm256_set1_pd(C[1]));
        let r2 = _mm256_mul_pd(r, r);
        let y = _mm256_fmadd_pd(r, _mm256_set1_pd(C[2]), _mm256_set1_pd(1.0));
        let y = _mm256_fmadd_pd(z, r2, y);
        _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
    }
}

/// `expf` of eight lanes, bit for bit the C library's.
///
/// # Safety
/// AVX2 and FMA must be available.
#[inline(always)]
pub(crate) unsafe fn expf8(x: __m256) -> __m256 {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let lo = main_path256(_mm256_castps256_ps128(x));
        let hi = main_path256(_mm256_extractf128_ps::<1>(x));
        let out = _mm256_insertf128_ps::<1>(_mm256_castps128_ps256(lo), hi);
        let minus_inf = _mm256_cmpeq_epi32(_mm256_castps_si256(x), _mm256_set1_epi32(MINUS_INF));
        let minus_inf = _mm256_castsi256_ps(minus_inf);
        let mut out = _mm256_andnot_ps(minus_inf, out);
        let abs = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fff_ffff));
        // Signed comparison is right: `abs` and the bound are both below 2^31.
        let over = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(SPECIAL_FROM as i32 - 1));
        let over = _mm256_andnot_ps(minus_inf, _mm256_castsi256_ps(over));
        let special = _mm256_movemask_ps(over) as u32;
        if special != 0 {
            let (mut xs, mut outs) = ([0f32; 8], [0f32; 8]);
            _mm256_storeu_ps(xs.as_mut_ptr(), x);
            _mm256_storeu_ps(outs.as_mut_ptr(), out);
            fix_special(&xs, &mut outs, special);
            out = _mm256_loadu_ps(outs.as_ptr());
        }
        out
    }
}

/// `expf` of every value in place, eight lanes at a time (the last few one by one).
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp_in_place_avx2(values: &mut [f32]) {
    let mut chunks = values.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let p = chunk.as_mut_ptr();
        // SAFETY: `p` reaches the chunk's eight values, and this function has AVX2 and FMA.
        unsafe { _mm256_storeu_ps(p, expf8(_mm256_loadu_ps(p))) };
    }
    for v in chunks.into_remainder() {
        *v = v.exp();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// glibc's `expf` of sixteen values with AVX-512.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512 F, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn run16(x: &[f32; 16]) -> [f32; 16] {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let mut out = [0f32; 16];
            _mm512_storeu_ps(out.as_mut_ptr(), expf16(_mm512_loadu_ps(x.as_ptr())));
            out
        }
    }

    /// glibc's `expf` of eight values with AVX2.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run8(x: &[f32; 8]) -> [f32; 8] {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let mut out = [0f32; 8];
            _mm256_storeu_ps(out.as_mut_ptr(), expf8(_mm256_loadu_ps(x.as_ptr())));
            out
        }
    }

    /// Checks both widths (where the CPU has them) against `f32::exp` on `values`, in
    /// groups of sixteen.
    fn check(values: impl Iterator<Item = f32>) -> usize {
        let narrow = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        let wide = narrow && is_x86_feature_detected!("avx512f");
        let wide = !crate::simd::cpu::lacks(wide, "AVX-512");
        if crate::simd::cpu::lacks(narrow, "AVX2") {
            return 0;
        }
        let mut checked = 0;
        let mut group = [0f32; 16];
        let mut n = 0;
        let flush = |group: &[f32; 16]| {
            let want = group.map(f32::exp);
            let same = |got: &[f32]| {
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let equal = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                    assert!(equal, "expf({:e}) = {g:e}, the library's {w:e}", group[i]);
                }
            };
            if wide {
                // SAFETY: each version runs only where the CPU has its features (checked above).
                same(&unsafe { run16(group) });
            }
            if narrow {
                let lo: [f32; 8] = group[..8].try_into().unwrap();
                let hi: [f32; 8] = group[8..].try_into().unwrap();
                // SAFETY: each version runs only where the CPU has its features (checked above).
                let both = [unsafe { run8(&lo) }, unsafe { run8(&hi) }];
                same(both.as_flattened());
            }
        };
        for v in values {
            group[n] = v;
            n += 1;
            checked += 1;
            if n == 16 {
                flush(&group);
                n = 0;
            }
        }
        if n > 0 {
            group[n..].fill(0.0);
            flush(&group);
        }
        checked
    }

    #[test]
    fn every_97th_bit_pattern_matches_the_library() {
        let stride = if cfg!(debug_assertions) { 9973 } else { 97 };
        let checked = check((0..=u32::MAX).step_by(stride).map(f32::from_bits));
        assert!(checked == 0 || checked > 400_000);
    }

    /// Every f32 (both widths matched all 2^32 on glibc 2.36: 45 s in a release build). Run it
    /// after changing the kernel or meeting a new C library (`cargo test --release -p
    /// ferrite-engine -- --ignored every_bit_pattern`).
    #[test]
    #[ignore = "every f32; run by hand after changing the kernel"]
    fn every_bit_pattern_matches_the_library() {
        let checked = check((0..=u32::MAX).map(f32::from_bits));
        assert!(checked == 0 || checked == 1 << 32);
    }

    #[test]
    fn the_special_cases_boundaries_match_the_library() {
        let edges = [
            0x42b0_0000u32, // 88: the first special
            0x42b1_7217,    // the largest finite result
            0x42b1_7218,
            0xc2b0_0000, // -88
            0xc2ce_8ecf, // the smallest subnormal from here down
            0xc2ce_8ed0,
            0xc2cf_f1b4, // zero from here down
            0xc2cf_f1b5,
            0x7f80_0000, // +inf
            0xff80_0000, // -inf
            0x7fc0_0000, // NaN
            0xffc0_0001,
            0x0000_0001, // subnormal arguments
            0x8000_0001,
            0x0000_0000,
            0x8000_0000,
        ];
        let around = edges
            .iter()
            .flat_map(|&b| (b.saturating_sub(300)..=b.saturating_add(300)).map(f32::from_bits));
        // Every f32 in [-1, 0] at a stride: the range attention's weights come from.
        let stride = if cfg!(debug_assertions) { 3001 } else { 31 };
        let unit = (0x8000_0000u32..=0xbf80_0000)
            .step_by(stride)
            .map(f32::from_bits);
        let checked = check(around.chain(unit));
        assert!(checked == 0 || checked > 350_000);
    }
}
