//! AVX2 versions of the K-quant dot products. Their integer sums are exact and their
//! floating-point steps are those of the portable code, so results are bit-identical.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::dot::hsum8;
use super::kquant::{scale_min_k4, Q4kSums, Q8KRow, Q4_K, Q6_K, QK_K};
use super::simd::f16_at;
use super::RowKernel;

/// Sum of the eight i32 lanes (exact).
#[target_feature(enable = "avx2")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_extracti128_si256::<1>(v), _mm256_castsi256_si128(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<1>(s));
    _mm_cvtsi128_si32(s)
}

/// Q4_K · Q8_K, as [`super::kquant::dot_q4k`].
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` holds whole super-blocks and `a` as many.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4k(w: &[u8], a: &Q8KRow, kernel: RowKernel) -> f32 {
    let blocks = w.len() / Q4_K;
    assert!(a.d.len() >= blocks && a.qs.len() >= blocks * QK_K && a.bsums.len() >= blocks * 16);
    let ones = _mm256_set1_epi16(1);
    let low = _mm256_set1_epi8(0x0F);
    let mut sums = Q4kSums::new(kernel);
    for b in 0..blocks {
        let block = w.as_ptr().add(b * Q4_K);
        let scales = std::slice::from_raw_parts(block.add(4), 12);
        let q8 = a.qs.as_ptr().add(b * QK_K);
        let bsums = &a.bsums[b * 16..(b + 1) * 16];
        let d = *a.d.get_unchecked(b);
        let (dd, dm) = (f16_at(block) * d, f16_at(block.add(2)) * d);
        for pair in 0..4 {
            let (mut psum, mut pmin) = (0i32, 0i32);
            let bytes = _mm256_loadu_si256(block.add(16 + pair * 32) as *const __m256i);
            let halves = [
                _mm256_and_si256(bytes, low),
                _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), low),
            ];
            for (half, x) in halves.into_iter().enumerate() {
                let j = pair * 2 + half;
                let y = _mm256_loadu_si256(q8.add(j * 32) as *const __m256i);
                let dot = hsum_i32(_mm256_madd_epi16(_mm256_maddubs_epi16(x, y), ones));
                let (sc, m) = scale_min_k4(j, scales);
                psum += sc * dot;
                pmin += m * (bsums[2 * j] + bsums[2 * j + 1]);
            }
            sums.pair(psum, pmin, dd, dm);
        }
        sums.end_block(dd, dm);
    }
    sums.result()
}

/// Q6_K · Q8_K, as [`super::kquant::dot_q6k`].
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` holds whole super-blocks and `a` as many.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q6k(w: &[u8], a: &Q8KRow) -> f32 {
    let blocks = w.len() / Q6_K;
    assert!(a.d.len() >= blocks && a.qs.len() >= blocks * QK_K && a.bsums.len() >= blocks * 16);
    let m3 = _mm256_set1_epi8(3);
    let m15 = _mm256_set1_epi8(15);
    let mut acc = _mm256_setzero_ps();
    for b in 0..blocks {
        let block = w.as_ptr().add(b * Q6_K);
        let (ql, qh, sc) = (block, block.add(128), block.add(192) as *const i8);
        let q8 = a.qs.as_ptr().add(b * QK_K);
        let d = *a.d.get_unchecked(b) * f16_at(block.add(208));
        let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc as *const __m128i));
        let bsums = _mm256_loadu_si256(a.bsums.as_ptr().add(b * 16) as *const __m256i);
        // bsums are i32 here; pack them to i16 in order for the multiply-add.
        let bsums_hi = _mm256_loadu_si256(a.bsums.as_ptr().add(b * 16 + 8) as *const __m256i);
        let bsums16 =
            _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(bsums, bsums_hi));
        let correction = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums16, scales));
        let mut lanes = _mm256_setzero_si256();
        for j in 0..2 {
            let bits1 = _mm256_loadu_si256(ql.add(64 * j) as *const __m256i);
            let bits2 = _mm256_loadu_si256(ql.add(64 * j + 32) as *const __m256i);
            let high = _mm256_loadu_si256(qh.add(32 * j) as *const __m256i);
            let u = [
                _mm256_or_si256(
                    _mm256_and_si256(bits1, m15),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(high, m3)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(bits2, m15),
                    _mm256_slli_epi16::<2>(_mm256_and_si256(high, _mm256_set1_epi8(12))),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(bits1), m15),
                    _mm256_and_si256(high, _mm256_set1_epi8(48)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(bits2), m15),
                    _mm256_srli_epi16::<2>(_mm256_and_si256(high, _mm256_set1_epi8(-64))),
                ),
            ];
            for (v, u) in u.into_iter().enumerate() {
                let y = _mm256_loadu_si256(q8.add(128 * j + 32 * v) as *const __m256i);
                let s0 = *sc.add(8 * j + 2 * v) as i16;
                let s1 = *sc.add(8 * j + 2 * v + 1) as i16;
                let scale = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
                lanes =
                    _mm256_add_epi32(lanes, _mm256_madd_epi16(scale, _mm256_maddubs_epi16(u, y)));
            }
        }
        lanes = _mm256_sub_epi32(lanes, correction);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    hsum8(&out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::kquant::{self, quantize_row_q8k};
    use crate::quant::simd::available;

    #[test]
    fn avx2_k_quants_are_bit_identical_to_the_portable_ones() {
        if !available() {
            return;
        }
        let cols = 512;
        let x: Vec<f32> = (0..cols)
            .map(|i| (i * 7919 % 1013) as f32 / 300.0 - 1.7)
            .collect();
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        let mut w4 = vec![0u8; cols / QK_K * Q4_K];
        let mut w6 = vec![0u8; cols / QK_K * Q6_K];
        for (i, b) in w4.iter_mut().chain(w6.iter_mut()).enumerate() {
            *b = (i * 131 % 251) as u8;
        }
        for block in w4.chunks_exact_mut(Q4_K) {
            block[0..4].copy_from_slice(&[0x00, 0x20, 0x00, 0x1c]);
        }
        for block in w6.chunks_exact_mut(Q6_K) {
            block[208..210].copy_from_slice(&[0x00, 0x1c]);
        }
        for kernel in [RowKernel::Gemv, RowKernel::Gemm4] {
            let (p4, f4) = (kquant::dot_q4k_portable(&w4, &a, kernel), unsafe {
                dot_q4k(&w4, &a, kernel)
            });
            assert_eq!(p4.to_bits(), f4.to_bits(), "Q4_K {kernel:?}: {p4} vs {f4}");
        }
        let (p6, f6) = (kquant::dot_q6k_portable(&w6, &a), unsafe {
            dot_q6k(&w6, &a)
        });
        assert_eq!(p6.to_bits(), f6.to_bits(), "Q6_K {p6} vs {f6}");
    }
}
