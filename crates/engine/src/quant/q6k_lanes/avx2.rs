//! The sixteen-row Q6_K layout's kernels for CPUs with AVX2 but without AVX-512 VNNI. Each
//! 64-byte line of the layout is two 256-bit halves of eight rows each (row `r`'s bytes at
//! `4r`), so a half is one AVX2 vector with one weight row per 32-bit lane, and the kernels
//! run the VNNI kernels' plans on it: four activations broadcast against four values of
//! eight rows, no horizontal sums but the GEMV's final one per row.
//!
//! Without `vpdpwssd`, four values times four activations is `vpmaddubsw` (pairs of
//! products as 16-bit sums; values are at most 63, so at most 2 · 63 · 127: never
//! saturated) then `vpmaddwd` with the sub-block's scale in both 16-bit halves of the lane.
//! Both arithmetic plans of the layout's module are kept: with `TILED`, llama.cpp's tiled
//! matmul's (one exact integer sum per super-block, as [`super::tiled`]); without, ggml's
//! AVX2 dot product's (eight integer lanes per super-block, each folded into its own `f32`
//! accumulator, as [`crate::quant::formats::q6_k::dot`]). The integer sums are exact
//! (modulo 2^32, as the portable code's) whatever their order, and the floating-point steps
//! are the same operations on the same values, one lane per weight row: results are
//! bit-identical to the portable kernels.
//!
//! A super-block is taken one half at a time, the half's lines in the first-level cache
//! after the first: the GEMV's eight integer lanes of eight rows fill half the registers.

use std::arch::x86_64::*;

use super::{Line, Q6kLanes, LINES, ROWS, SCALES, VALUES};
use crate::quant::q8k::Q8KRow;
use crate::quant::q8k::QK_K;
use crate::simd::int_lanes::pair16;
use crate::simd::prefetch::{prefetch_span, Upcoming};

/// Rows per half line (one per 32-bit lane of a 256-bit vector).
const HALF: usize = ROWS / 2;

/// Group `g`'s sixteen rows against `T` activation rows: `out[t][r]` is row `16g + r` ·
/// `a[t]` (zero past the matrix), with the tiled matmul's arithmetic where `TILED`, the
/// dot product's (one activation row, `T` = 1) otherwise. `soon`: lines to ask the memory
/// for meanwhile ([`Upcoming`]).
///
/// # Safety
/// AVX2, FMA and F16C must be available ([`crate::simd::avx2`]).
pub unsafe fn dot_group<const T: usize, const TILED: bool>(
    m: &Q6kLanes,
    g: usize,
    a: [&Q8KRow; T],
    soon: Upcoming,
) -> [[f32; ROWS]; T] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        assert!(
            TILED || T == 1,
            "the dot product's eight lanes take one activation row"
        );
        assert!(a.iter().all(|row| row.has_blocks(m.blocks)));
        group_avx2::<T, TILED>(m.group(g), m.blocks, a, soon)
    }
}

/// Sub-block `j`'s value vector `c` (values `16j + 4c..16j + 4c + 4` of eight rows, as
/// unsigned bytes) from half `h` of the super-block at `base`.
///
/// # Safety
///
/// The CPU has AVX2; `base` points at a readable super-block of the group's lines
/// (64-byte aligned, as the layout keeps them), `j < 16`, `c < 4` and `h < 2`.
#[inline(always)]
unsafe fn values(base: *const u8, j: usize, c: usize, h: usize) -> __m256i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let line =
            |k: usize| _mm256_load_si256(base.add(64 * (VALUES + 3 * j + k) + 32 * h).cast());
        let nibble = _mm256_set1_epi8(0x0F);
        let bits = line(c / 2);
        let low = match c % 2 {
            0 => bits,
            _ => _mm256_srli_epi16::<4>(bits),
        };
        // The high two bits of vector c sit at bit 2c of the third line's bytes; bring them to
        // bits 4 and 5. Shifts of 16-bit lanes: the bits a byte takes from its neighbour are
        // masked off.
        let high = line(2);
        let high = match c {
            0 => _mm256_slli_epi16::<4>(high),
            1 => _mm256_slli_epi16::<2>(high),
            2 => high,
            _ => _mm256_srli_epi16::<2>(high),
        };
        _mm256_or_si256(
            _mm256_and_si256(low, nibble),
            _mm256_and_si256(high, _mm256_set1_epi8(0x30)),
        )
    }
}

/// Sub-block `j`'s scales of the eight rows of half `h`, each as a pair of equal 16-bit
/// integers in its row's lane.
///
/// # Safety
///
/// The CPU has AVX2; `base` points at a readable super-block of the group's lines,
/// `j < 16` and `h < 2`.
#[inline(always)]
unsafe fn scale_pairs(base: *const u8, j: usize, h: usize) -> __m256i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let bytes = base.add(64 * (SCALES + j / 4) + (j % 4) * ROWS + HALF * h);
        let scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64(bytes.cast()));
        _mm256_blend_epi16::<0xAA>(scale, _mm256_slli_epi32::<16>(scale))
    }
}

/// [`dot_group`] on a group's lines.
///
/// # Safety
///
/// The CPU has AVX2, FMA and F16C; the arguments are [`dot_group`]'s, as its caller
/// guarantees them.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<const T: usize, const TILED: bool>(
    lines: &[Line],
    blocks: usize,
    a: [&Q8KRow; T],
    mut soon: Upcoming,
) -> [[f32; ROWS]; T] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let ahead = crate::simd::cpu::prefetch_ahead();
        assert!(lines.len() >= blocks * LINES);
        let zero = _mm256_setzero_si256();
        // Per half: the tiled plan's sums per activation row, the dot product's per lane.
        let mut tiled = [[_mm256_setzero_ps(); 2]; T];
        let mut acc = [[_mm256_setzero_ps(); 8]; 2];
        for b in 0..blocks {
            let base = lines.as_ptr().add(b * LINES) as *const u8;
            prefetch_span(base, LINES * 64, ahead);
            soon.step();
            let q8: [*const i32; T] = a.map(|a| a.qs.as_ptr().add(b * QK_K) as *const i32);
            for h in 0..2 {
                let dw = _mm256_load_ps(base.add(32 * h) as *const f32);
                // The tiled plan's sum per activation row, or the dot product's eight lanes.
                let mut lanes = [[zero; 8]; T];
                for m in 0..8 {
                    let scales = [2 * m, 2 * m + 1].map(|j| scale_pairs(base, j, h));
                    for (s, &scale) in scales.iter().enumerate() {
                        let j = 2 * m + s;
                        for c in 0..4 {
                            let w = values(base, j, c, h);
                            for t in 0..T {
                                let y = _mm256_set1_epi32(q8[t].add(4 * j + c).read_unaligned());
                                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), scale);
                                let lane = &mut lanes[t][if TILED { 0 } else { 4 * s + c }];
                                *lane = _mm256_add_epi32(*lane, p);
                            }
                        }
                    }
                    // The values are stored 32 higher: less 32 · (bsums[2m] · sc[2m] +
                    // bsums[2m + 1] · sc[2m + 1]), in lane m of the dot product.
                    let both =
                        _mm256_slli_epi16::<5>(_mm256_blend_epi16::<0xAA>(scales[0], scales[1]));
                    for t in 0..T {
                        let bsums = a[t].bsums.as_ptr().add(b * 16 + 2 * m);
                        let pair = _mm256_set1_epi32(pair16(-*bsums, -*bsums.add(1)));
                        let lane = &mut lanes[t][if TILED { 0 } else { m }];
                        *lane = _mm256_add_epi32(*lane, _mm256_madd_epi16(both, pair));
                    }
                }
                for t in 0..T {
                    let da = _mm256_set1_ps(*a[t].d.get_unchecked(b));
                    if TILED {
                        let total = _mm256_mul_ps(_mm256_cvtepi32_ps(lanes[t][0]), dw);
                        tiled[t][h] = _mm256_fmadd_ps(total, da, tiled[t][h]);
                    } else {
                        let d = _mm256_mul_ps(da, dw);
                        for (acc, &lane) in acc[h].iter_mut().zip(&lanes[t]) {
                            *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lane), *acc);
                        }
                    }
                }
            }
        }
        let mut out = [[0f32; ROWS]; T];
        for (t, out) in out.iter_mut().enumerate() {
            for h in 0..2 {
                let sum = match TILED {
                    true => tiled[t][h],
                    // hsum_float_8, one weight row per vector lane.
                    false => {
                        let a = &acc[h];
                        let r = [0, 1, 2, 3].map(|i| _mm256_add_ps(a[i], a[i + 4]));
                        _mm256_add_ps(_mm256_add_ps(r[0], r[2]), _mm256_add_ps(r[1], r[3]))
                    }
                };
                _mm256_storeu_ps(out.as_mut_ptr().add(HALF * h), sum);
            }
        }
        out
    }
}
