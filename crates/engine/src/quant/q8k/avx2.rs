//! [`super::quantize_row_q8k`] with AVX2: the same bytes, sums and scales as the portable
//! code.

use std::arch::x86_64::*;

use super::{Q8KRow, QK_K};
use crate::quant::RowKernel;

/// [`super::quantize_row_q8k`] eight values at a time: the same extreme (the first
/// of largest magnitude, or for the GEMM the positive one on a tie), scale and rounding
/// (half to even), so the same bytes, sums and scales.
///
/// # Safety
/// Safe where AVX2, FMA and F16C are enabled; elsewhere the caller must know the CPU has
/// them ([`crate::simd::avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn quantize_row_q8k(x: &[f32], kernel: RowKernel) -> Q8KRow {
    // SAFETY: every pointer read is `p + k` with `k < QK_K`, `p` the start of block `b`
    // of `x` (which holds `blocks` whole blocks), every write `qs + k` with `k < QK_K`
    // into block `b` of `row.qs` (`blocks · QK_K` bytes), and the lane stores go into
    // arrays of eight; the CPU features are this function's.
    unsafe {
        let blocks = x.len() / QK_K;
        let mut row = Q8KRow {
            d: Vec::with_capacity(blocks),
            qs: vec![0; blocks * QK_K],
            bsums: vec![0; blocks * 16],
        };
        let sign = _mm256_set1_ps(-0.0);
        const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        for b in 0..blocks {
            let block = &x[b * QK_K..(b + 1) * QK_K];
            let p = block.as_ptr();
            let mut m = _mm256_setzero_ps();
            for i in (0..QK_K).step_by(8) {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(i))));
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), m);
            let amax = lanes.iter().fold(0f32, |a, &l| a.max(l));
            if amax == 0.0 {
                row.d.push(0.0);
                continue;
            }
            // The first value of that magnitude; on a tie the GEMM takes +amax.
            let first = block
                .iter()
                .position(|v| v.abs() == amax)
                .expect("amax is some value's magnitude");
            let mut max = block[first];
            if kernel.in_group_of_four() && max < 0.0 && block[first..].contains(&amax) {
                max = amax;
            }
            let iscale = -127.0 / max;
            let scale = _mm256_set1_ps(iscale);
            let top = _mm256_set1_epi32(127);
            let qs = row.qs.as_mut_ptr().add(b * QK_K);
            for g in 0..16 {
                let q = [0, 8].map(|i| {
                    let v = _mm256_mul_ps(scale, _mm256_loadu_ps(p.add(16 * g + i)));
                    _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_round_ps::<NEAREST>(v)), top)
                });
                let mut sums = [0i32; 8];
                _mm256_storeu_si256(
                    sums.as_mut_ptr() as *mut __m256i,
                    _mm256_add_epi32(q[0], q[1]),
                );
                row.bsums[b * 16 + g] = sums.iter().sum();
                // Pack to bytes (the packs interleave 128-bit halves; the permutation undoes it).
                let words =
                    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[0], q[1]));
                let bytes = _mm256_packs_epi16(words, words);
                let bytes = _mm256_permute4x64_epi64::<0b11_01_10_00>(bytes);
                _mm_storeu_si128(
                    qs.add(16 * g) as *mut __m128i,
                    _mm256_castsi256_si128(bytes),
                );
            }
            row.d.push(1.0 / iscale);
        }
        row
    }
}
