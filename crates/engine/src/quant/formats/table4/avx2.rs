//! The family's AVX2 kernel: a group of eight rows by one Q8 activation row. Each row's
//! indices are looked up in the table (`vpshufb`), multiplied with the activations as
//! signed bytes (`vpsignb` moves the weight's sign onto the activation, `vpmaddubsw` and
//! `vpmaddwd` sum the products in pairs, then fours), the eight rows' partial sums are
//! added across lanes to one integer per row, and one fused multiply-add per block folds
//! them into the rows' accumulators, as [`super::dot`] does.

use std::arch::x86_64::*;

use super::{Block8, Table4};
use crate::quant::q8::Q8Row;

/// Group `blocks` (one per 32 values of the row) by activation row `a`: each of the eight
/// rows' [`super::dot`].
///
/// Calling it is unsafe where the CPU is not known to have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub fn group<F: Table4>(blocks: &[Block8], a: &Q8Row) -> [f32; 8] {
    assert!(a.qs.len() >= blocks.len() * 32 && a.d.len() >= blocks.len());
    // SAFETY: the table is 16 bytes.
    let table = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(F::VALUES.as_ptr().cast()) });
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (b, block) in blocks.iter().enumerate() {
        // SAFETY: 32 bytes from `b · 32`, within `a.qs` by the assertion.
        let q = unsafe { _mm256_loadu_si256(a.qs.as_ptr().add(b * 32).cast()) };
        let mut sums = [_mm256_setzero_si256(); 8];
        for (r, sum) in sums.iter_mut().enumerate() {
            // SAFETY: `qs[r]` is 16 bytes.
            let bytes = unsafe { _mm_loadu_si128(block.qs[r].as_ptr().cast()) };
            // Low nibbles are values 0..16, high ones 16..32.
            let idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), low);
            let w = _mm256_shuffle_epi8(table, idx);
            // |w| ≤ 127 and |q| ≤ 127: a pair's sum stays within an i16.
            let products = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w));
            *sum = _mm256_madd_epi16(products, ones);
        }
        // Eight vectors of eight partial sums to one vector of eight row sums.
        let s01 = _mm256_hadd_epi32(sums[0], sums[1]);
        let s23 = _mm256_hadd_epi32(sums[2], sums[3]);
        let s45 = _mm256_hadd_epi32(sums[4], sums[5]);
        let s67 = _mm256_hadd_epi32(sums[6], sums[7]);
        let s0123 = _mm256_hadd_epi32(s01, s23);
        let s4567 = _mm256_hadd_epi32(s45, s67);
        let rows = _mm256_add_epi32(
            _mm256_permute2x128_si256(s0123, s4567, 0x20),
            _mm256_permute2x128_si256(s0123, s4567, 0x31),
        );
        // SAFETY: eight floats.
        let scales = unsafe { _mm256_loadu_ps(block.scales.as_ptr()) };
        let dd = _mm256_mul_ps(scales, _mm256_set1_ps(a.d[b]));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(rows), dd, acc);
    }
    let mut out = [0f32; 8];
    // SAFETY: `out` holds eight floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
    out
}
