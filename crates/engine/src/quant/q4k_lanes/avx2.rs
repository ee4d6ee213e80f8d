//! The sixteen-row Q4_K layout's kernel for CPUs with AVX2 but without AVX-512 VNNI. Each
//! 64-byte line of the layout is two 256-bit halves of eight rows each (row `r`'s bytes at
//! `4r`, as the module describes), so a half is one AVX2 vector with one weight row per
//! 32-bit lane, and the kernel runs the same plan as the VNNI one: four activations
//! broadcast against four values of eight rows, no horizontal sums anywhere.
//!
//! Without `vpdpbusd`, four values times four activations is `vpmaddubsw` (pairs of
//! products as 16-bit sums; at most 2 · 15 · 128, so never saturated); a sub-block's eight
//! of them are added in 16 bits (at most 30,720), then one `vpmaddwd` with the sub-block's
//! scale in both 16-bit halves of the lane adds the pairs and applies the scale: nine
//! multiplying instructions per sub-block and activation row where one `vpmaddwd` after
//! each `vpmaddubsw` took sixteen, the multiply pipes being what bounds the kernel. The integer sums are exact whatever their order, and the
//! floating-point steps are those of [`crate::quant::formats::q4_k::dot`], one lane
//! per weight row, so results are bit-identical to it.
//!
//! The kernel takes a super-block one half at a time: the half's lines are in the
//! first-level cache after the first, and eight rows leave registers for four activation
//! rows' sums.

use std::arch::x86_64::*;

use super::{Line, Q4kLanes, LINES, MINS, ROWS, VALUES};
use crate::quant::q8k::Q8KRow;
use crate::quant::q8k::QK_K;
use crate::quant::RowKernel;
use crate::simd::int_lanes::pair16;
use crate::simd::prefetch::{prefetch_span, Upcoming};

/// Rows per half line (one per 32-bit lane of a 256-bit vector).
const HALF: usize = ROWS / 2;

/// Group `g`'s sixteen rows against `T` activation rows, each rounded as its kernel says:
/// `out[t][r]` is row `16g + r` · `a[t]` (zero past the matrix). `soon`: lines to ask the
/// memory for meanwhile ([`Upcoming`]).
///
/// # Safety
/// AVX2, FMA and F16C must be available ([`crate::simd::avx2`]).
pub unsafe fn dot_group<const T: usize>(
    m: &Q4kLanes,
    g: usize,
    a: [&Q8KRow; T],
    kernels: [RowKernel; T],
    soon: Upcoming,
) -> [[f32; ROWS]; T] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        assert!(a.iter().all(|row| row.has_blocks(m.blocks)));
        group_avx2(m.group(g), m.blocks, a, kernels, soon)
    }
}

/// [`dot_group`] on a group's lines. Per half and sub-block: the eight rows' scales as
/// 16-bit pairs, then per line of values its two nibbles' vectors, each multiplied by four
/// broadcast activations and the scales; per pair of sub-blocks one 16-bit multiply-add for
/// the minimum terms, then the floating-point steps, one lane per weight row.
///
/// # Safety
///
/// The CPU has AVX2, FMA and F16C; the arguments are [`dot_group`]'s, as its caller
/// guarantees them.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<const T: usize>(
    lines: &[Line],
    blocks: usize,
    a: [&Q8KRow; T],
    kernels: [RowKernel; T],
    mut soon: Upcoming,
) -> [[f32; ROWS]; T] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let ahead = crate::simd::cpu::prefetch_ahead();
        assert!(lines.len() >= blocks * LINES);
        let per_pair = kernels.map(RowKernel::in_group_of_four);
        let low = _mm256_set1_epi8(0x0F);
        let zero = _mm256_setzero_si256();
        let mut acc = [[_mm256_setzero_ps(); 2]; T];
        let mut acc_min = [[_mm256_setzero_ps(); 2]; T];
        for b in 0..blocks {
            let base = lines.as_ptr().add(b * LINES) as *const u8;
            prefetch_span(base, LINES * 64, ahead);
            soon.step();
            // Byte `byte` of the super-block's line `line`.
            let at = |line: usize, byte: usize| base.wrapping_add(64 * line + byte);
            for h in 0..2 {
                let d = _mm256_cvtph_ps(_mm_load_si128(at(0, 16 * h) as *const __m128i));
                let dmin = _mm256_cvtph_ps(_mm_load_si128(at(0, 32 + 16 * h) as *const __m128i));
                let da: [__m256; T] =
                    std::array::from_fn(|t| _mm256_set1_ps(*a[t].d.get_unchecked(b)));
                let dd: [__m256; T] = std::array::from_fn(|t| _mm256_mul_ps(d, da[t]));
                let dm: [__m256; T] = std::array::from_fn(|t| _mm256_mul_ps(dmin, da[t]));
                let mut isum = [zero; T];
                let mut imin = [zero; T];
                for pair in 0..4 {
                    let mut psum = [zero; T];
                    for j in [2 * pair, 2 * pair + 1] {
                        let scales = at(1 + j / 4, (j % 4) * ROWS + HALF * h) as *const __m128i;
                        let scale = _mm256_cvtepu8_epi32(_mm_loadl_epi64(scales));
                        let scale = _mm256_or_si256(scale, _mm256_slli_epi32::<16>(scale));
                        // The sub-block's pairs of products summed in 16 bits (sixteen
                        // products a lane, at most 16 · 15 · 128 = 30,720: exact), then
                        // scaled and added in pairs by one `vpmaddwd`.
                        let mut p16 = [zero; T];
                        for i in 0..4 {
                            // Line 4j + i holds values 8i..8i + 4 of the sub-block in its low
                            // nibbles, 8i + 4..8i + 8 in its high ones.
                            let v =
                                _mm256_load_si256(at(VALUES + 4 * j + i, 32 * h) as *const __m256i);
                            let x = [
                                _mm256_and_si256(v, low),
                                _mm256_and_si256(_mm256_srli_epi16::<4>(v), low),
                            ];
                            for t in 0..T {
                                let q8 =
                                    a[t].qs.as_ptr().add(b * QK_K + 32 * j + 8 * i) as *const i32;
                                for (k, &x) in x.iter().enumerate() {
                                    let y = _mm256_set1_epi32(q8.add(k).read_unaligned());
                                    p16[t] = _mm256_add_epi16(p16[t], _mm256_maddubs_epi16(x, y));
                                }
                            }
                        }
                        for t in 0..T {
                            psum[t] = _mm256_add_epi32(psum[t], _mm256_madd_epi16(p16[t], scale));
                        }
                    }
                    let mins = at(MINS + pair / 2, 32 * (pair % 2) + 16 * h) as *const __m128i;
                    let mins = _mm256_cvtepu8_epi16(_mm_load_si128(mins));
                    for t in 0..T {
                        let bsums = a[t].bsums.as_ptr().add(b * 16 + 4 * pair);
                        let sums = pair16(*bsums + *bsums.add(1), *bsums.add(2) + *bsums.add(3));
                        let pmin = _mm256_madd_epi16(mins, _mm256_set1_epi32(sums));
                        if per_pair[t] {
                            let (p, m) = (_mm256_cvtepi32_ps(psum[t]), _mm256_cvtepi32_ps(pmin));
                            acc[t][h] = _mm256_fmadd_ps(p, dd[t], acc[t][h]);
                            acc_min[t][h] = _mm256_fmadd_ps(m, dm[t], acc_min[t][h]);
                        } else {
                            isum[t] = _mm256_add_epi32(isum[t], psum[t]);
                            imin[t] = _mm256_add_epi32(imin[t], pmin);
                        }
                    }
                }
                for t in 0..T {
                    if !per_pair[t] {
                        let (s, m) = (_mm256_cvtepi32_ps(isum[t]), _mm256_cvtepi32_ps(imin[t]));
                        acc[t][h] = _mm256_fmadd_ps(s, dd[t], acc[t][h]);
                        acc_min[t][h] = _mm256_fmadd_ps(m, dm[t], acc_min[t][h]);
                    }
                }
            }
        }
        let mut out = [[0f32; ROWS]; T];
        for t in 0..T {
            for h in 0..2 {
                let sum = _mm256_sub_ps(acc[t][h], acc_min[t][h]);
                _mm256_storeu_ps(out[t].as_mut_ptr().add(HALF * h), sum);
            }
        }
        out
    }
}
