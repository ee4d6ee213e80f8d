//! [`super::quantize_row`] with AVX2: the same bytes as the portable code.

use std::arch::x86_64::*;

use super::Q8Row;

/// [`super::quantize_row`] eight values at a time: the same block maximum, scale and
/// rounding (half to even), so the same bytes.
///
/// # Safety
/// Safe where AVX2, FMA and F16C are enabled; elsewhere the caller must know the CPU has
/// them ([`crate::simd::avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn quantize_row(x: &[f32]) -> Q8Row {
    // SAFETY: every pointer read is `p + k` with `k < 32`, `p` the start of block `b` of
    // `x` (which holds `blocks` whole blocks), the value store goes into block `b` of
    // `row.qs` (`blocks · 32` bytes), and the lane stores into arrays of eight; the CPU
    // features are this function's.
    unsafe {
        let blocks = x.len() / 32;
        let mut row = Q8Row {
            d: Vec::with_capacity(blocks),
            s: Vec::with_capacity(blocks),
            qs: vec![0; blocks * 32],
        };
        let sign = _mm256_set1_ps(-0.0);
        for b in 0..blocks {
            let p = x.as_ptr().add(b * 32);
            let v = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(p.add(i)));
            let mut m = _mm256_andnot_ps(sign, v[0]);
            for v in &v[1..] {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *v));
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), m);
            let amax = lanes.iter().fold(0f32, |a, &l| a.max(l));
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            let q = v.map(|v| _mm256_cvtps_epi32(_mm256_round_ps::<NEAREST>(_mm256_mul_ps(v, id))));
            let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let mut sums = [0i32; 8];
            _mm256_storeu_si256(sums.as_mut_ptr() as *mut __m256i, sum);
            // Pack to bytes; the packs interleave 128-bit halves, the permutation undoes it.
            let packed = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let packed =
                _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(row.qs.as_mut_ptr().add(b * 32) as *mut __m256i, packed);
            row.d.push(half::f16::from_f32(d).to_f32());
            row.s
                .push(half::f16::from_f32(d * sums.iter().sum::<i32>() as f32).to_f32());
        }
        row
    }
}
