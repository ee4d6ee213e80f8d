//! The sixteen-row K-quant layout's kernels, for CPUs with AVX2: half a line (eight rows,
//! one per 32-bit lane) is one vector, and four values of eight rows times four broadcast
//! activations are `vpmaddubsw` (pairs of products as 16-bit sums) then `vpmaddwd` with the
//! sub-block's scale in both 16-bit halves of the lane, which adds the pairs and applies the
//! scale in one step.
//!
//! `vpmaddubsw` multiplies unsigned by signed bytes. Q5_K's values (at most 31) and Q2_K's
//! (at most 3) are unsigned, so a pair is at most 2 · 31 · 128: never saturated. IQ4_XS's
//! table values and Q3_K's (its three bits less 4) are signed: as in llama.cpp, their
//! magnitudes are multiplied by the activations carrying the values' signs (Q8_K
//! activations lie in −127..=127, so the sign never overflows, and a pair is at most
//! 2 · 127 · 127).
//!
//! [`dot_group`] (Q3_K, Q5_K, IQ4_XS) keeps both arithmetic plans of the module: with
//! `TILED` the tiled matmul's (one exact integer sum per super-block and activation row),
//! without it the dot product's (eight integer lanes, each folded into its own `f32`
//! accumulator per super-block, one activation row). [`dot_group_q2k`] follows llama.cpp's
//! repacked Q2_K kernels. A super-block is taken one half at a time, the half's lines in the
//! first-level cache after the first.

use std::arch::x86_64::*;

use super::{block_lines, chunk_line, nibble_line, two_bit_line, Bits, KLane};
use super::{KLanes, Line, MINS, ROWS, SCALES};
use crate::quant::iq4;
use crate::quant::q8k::Q8KRow;
use crate::quant::q8k::QK_K;
use crate::quant::RowKernel;
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
pub unsafe fn dot_group<const T: usize, const TILED: bool, F: KLane>(
    m: &KLanes<F>,
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
        assert!(F::BITS != Bits::Two, "Q2_K takes dot_group_q2k");
        group_avx2::<T, TILED, F>(m.group(g), m.blocks, a, soon)
    }
}

/// Bit `from` of each byte of `bits` moved to bit `to`, the others cleared (`from` and
/// `to` known when the caller's loops are unrolled). Shifts of 16-bit lanes: the bits a
/// byte takes from its neighbour are masked off.
///
/// # Safety
///
/// The CPU has AVX2.
#[inline(always)]
unsafe fn bit_to(bits: __m256i, from: usize, to: usize) -> __m256i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let moved = match from >= to {
            true => _mm256_srl_epi16(bits, _mm_cvtsi32_si128((from - to) as i32)),
            false => _mm256_sll_epi16(bits, _mm_cvtsi32_si128((to - from) as i32)),
        };
        _mm256_and_si256(moved, _mm256_set1_epi8(1 << to))
    }
}

/// [`dot_group`] on a group's lines of `F`.
///
/// # Safety
///
/// The CPU has AVX2, FMA and F16C; the arguments are [`dot_group`]'s, as its caller
/// guarantees them.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<const T: usize, const TILED: bool, F: KLane>(
    lines: &[Line],
    blocks: usize,
    a: [&Q8KRow; T],
    mut soon: Upcoming,
) -> [[f32; ROWS]; T] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let per = block_lines::<F>();
        let ahead = crate::simd::cpu::prefetch_ahead();
        assert!(lines.len() >= blocks * per);
        let zero = _mm256_setzero_si256();
        let low = _mm256_set1_epi8(0x0F);
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(iq4::VALUES.as_ptr().cast()));
        // Per half: the tiled plan's sums per activation row; the dot product's eight lanes
        // and (Q5_K) its minimums' sum.
        let mut tiled = [[_mm256_setzero_ps(); 2]; T];
        let mut acc = [[_mm256_setzero_ps(); 8]; 2];
        let mut acc_min = [_mm256_setzero_ps(); 2];
        for b in 0..blocks {
            let base = lines.as_ptr().add(b * per) as *const u8;
            prefetch_span(base, per * 64, ahead);
            soon.step();
            // Byte `byte` of the super-block's line `line`.
            let at = |line: usize, byte: usize| base.wrapping_add(64 * line + byte);
            let load = |line: usize, h: usize| _mm256_load_si256(at(line, 32 * h).cast());
            let q8: [*const i32; T] = a.map(|a| a.qs.as_ptr().add(b * QK_K) as *const i32);
            for h in 0..2 {
                let d = _mm256_cvtph_ps(_mm_load_si128(at(0, 16 * h).cast()));
                // Sub-block `s`'s scales of the half's eight rows, a pair of 16-bit integers
                // in each row's lane.
                let scale = |s: usize| {
                    let bytes = at(SCALES + s / 4, (s % 4) * ROWS + HALF * h);
                    let scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64(bytes.cast()));
                    _mm256_blend_epi16::<0xAA>(scale, _mm256_slli_epi32::<16>(scale))
                };
                // The tiled plan's sum per activation row, or the dot product's eight lanes.
                let mut lanes = [[zero; 8]; T];
                for j in 0..8 {
                    // Q3_K's sub-blocks are 16 values: two scales a chunk of 32.
                    let scales = match F::BITS {
                        Bits::Three => [scale(2 * j), scale(2 * j + 1)],
                        _ => [scale(j); 2],
                    };
                    // Q3_K's high bits or Q5_K's fifth bits, and Q3_K's low bits.
                    let first = chunk_line::<F>(j);
                    let top = match F::BITS {
                        Bits::Table => zero,
                        _ => load(first, h),
                    };
                    let low2 = match F::BITS {
                        Bits::Three => [0, 1].map(|k| load(two_bit_line::<F>(j, k), h)),
                        _ => [zero; 2],
                    };
                    for i in 0..4 {
                        let v = match F::BITS {
                            Bits::Three => zero,
                            _ => load(nibble_line::<F>(j, i), h),
                        };
                        for n in 0..2 {
                            // Values 4q..4q + 4 of the chunk: the dot product's lane q.
                            let q = 2 * i + n;
                            let nibbles = match n {
                                0 => _mm256_and_si256(v, low),
                                _ => _mm256_and_si256(_mm256_srli_epi16::<4>(v), low),
                            };
                            // The values as bytes: Q5_K's unsigned, the others' signed.
                            let x = match F::BITS {
                                Bits::Three => {
                                    let bits = _mm256_srl_epi16(
                                        low2[q / 4],
                                        _mm_cvtsi32_si128(2 * (q % 4) as i32),
                                    );
                                    let u = _mm256_or_si256(
                                        _mm256_and_si256(bits, _mm256_set1_epi8(3)),
                                        bit_to(top, q, 2),
                                    );
                                    _mm256_sub_epi8(u, _mm256_set1_epi8(4))
                                }
                                Bits::Five => _mm256_or_si256(nibbles, bit_to(top, q, 4)),
                                Bits::Table => _mm256_shuffle_epi8(table, nibbles),
                                Bits::Two => unreachable!("Q2_K takes dot_group_q2k"),
                            };
                            let unsigned = F::BITS == Bits::Five;
                            let ax = if unsigned { x } else { _mm256_abs_epi8(x) };
                            for t in 0..T {
                                let y = _mm256_set1_epi32(q8[t].add(8 * j + q).read_unaligned());
                                let y = if unsigned { y } else { _mm256_sign_epi8(y, x) };
                                let p =
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, y), scales[i / 2]);
                                let lane = &mut lanes[t][if TILED { 0 } else { q }];
                                *lane = _mm256_add_epi32(*lane, p);
                            }
                        }
                    }
                }
                // Q5_K's minimum terms: per pair of sub-blocks one 16-bit multiply-add of the
                // rows' two minimums by the activations' sums.
                let mut imin = [zero; T];
                if F::BITS == Bits::Five {
                    for pair in 0..4 {
                        let mins = at(MINS + pair / 2, 32 * (pair % 2) + 16 * h);
                        let mins = _mm256_cvtepu8_epi16(_mm_load_si128(mins.cast()));
                        for t in 0..T {
                            let bsums = a[t].bsums.as_ptr().add(b * 16 + 4 * pair);
                            let sums =
                                pair16(*bsums + *bsums.add(1), *bsums.add(2) + *bsums.add(3));
                            let pmin = _mm256_madd_epi16(mins, _mm256_set1_epi32(sums));
                            imin[t] = _mm256_add_epi32(imin[t], pmin);
                        }
                    }
                }
                let dmin = match F::BITS {
                    Bits::Five => _mm256_cvtph_ps(_mm_load_si128(at(0, 32 + 16 * h).cast())),
                    _ => _mm256_setzero_ps(),
                };
                for t in 0..T {
                    let da = _mm256_set1_ps(*a[t].d.get_unchecked(b));
                    if TILED {
                        // s1·d − dmin·s2, then times the activation's scale.
                        let mut result = _mm256_mul_ps(_mm256_cvtepi32_ps(lanes[t][0]), d);
                        if F::BITS == Bits::Five {
                            result = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(imin[t]), result);
                        }
                        tiled[t][h] = _mm256_fmadd_ps(result, da, tiled[t][h]);
                    } else {
                        let dd = _mm256_mul_ps(da, d);
                        for (acc, &lane) in acc[h].iter_mut().zip(&lanes[t]) {
                            *acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(lane), *acc);
                        }
                        if F::BITS == Bits::Five {
                            let dm = _mm256_mul_ps(da, dmin);
                            let m = _mm256_cvtepi32_ps(imin[t]);
                            acc_min[h] = _mm256_fnmadd_ps(m, dm, acc_min[h]);
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
                    // hsum_float_8, one weight row per vector lane, then (Q5_K) the minimums.
                    false => {
                        let a = &acc[h];
                        let r = [0, 1, 2, 3].map(|i| _mm256_add_ps(a[i], a[i + 4]));
                        let sum =
                            _mm256_add_ps(_mm256_add_ps(r[0], r[2]), _mm256_add_ps(r[1], r[3]));
                        match F::BITS {
                            Bits::Five => _mm256_add_ps(sum, acc_min[h]),
                            _ => sum,
                        }
                    }
                };
                _mm256_storeu_ps(out.as_mut_ptr().add(HALF * h), sum);
            }
        }
        out
    }
}

/// Group `g`'s sixteen Q2_K rows against `T` activation rows, each rounded as its kernel
/// says (llama.cpp's repacked Q2_K kernels, `crate::quant::formats::q2_k::dot_repacked`): `out[t][r]` is
/// row `16g + r` · `a[t]` (zero past the matrix). `soon`: lines to ask the memory for
/// meanwhile ([`Upcoming`]).
///
/// # Safety
/// AVX2, FMA and F16C must be available ([`crate::simd::avx2`]).
pub unsafe fn dot_group_q2k<const T: usize, F: KLane>(
    m: &KLanes<F>,
    g: usize,
    a: [&Q8KRow; T],
    kernels: [RowKernel; T],
    soon: Upcoming,
) -> [[f32; ROWS]; T] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        assert!(F::BITS == Bits::Two, "{} is not Q2_K", F::NAME);
        assert!(a.iter().all(|row| row.has_blocks(m.blocks)));
        group_q2k_avx2::<T, F>(m.group(g), m.blocks, a, kernels, soon)
    }
}

/// [`dot_group_q2k`] on a group's lines. Per half super-block (four chunks of 32) and
/// activation row: the values' products by the sub-blocks' scales in one integer sum, the
/// minimums by the activations' sums in another, then the floating-point steps of
/// `formats::kquant::PairSums` (per half for a row of a four-row group, per super-block otherwise),
/// one lane per weight row. Those steps are written as in Q4_K's kernel
/// (`q4k_lanes/avx2.rs`): one struct holding them for both measured 10–25% slower on a Zen 3
/// (`matmul_kernels`, Q4_K at 4–16 rows 57 against 43 GMAC/s).
///
/// # Safety
///
/// The CPU has AVX2, FMA and F16C; the arguments are [`dot_group_q2k`]'s, as its caller
/// guarantees them.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_q2k_avx2<const T: usize, F: KLane>(
    lines: &[Line],
    blocks: usize,
    a: [&Q8KRow; T],
    kernels: [RowKernel; T],
    mut soon: Upcoming,
) -> [[f32; ROWS]; T] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let per = block_lines::<F>();
        let ahead = crate::simd::cpu::prefetch_ahead();
        assert!(lines.len() >= blocks * per);
        let per_half = kernels.map(RowKernel::in_group_of_four);
        let zero = _mm256_setzero_si256();
        let (three, nibble) = (_mm256_set1_epi8(3), _mm256_set1_epi32(0x0F));
        let mut acc = [[_mm256_setzero_ps(); 2]; T];
        let mut acc_min = [[_mm256_setzero_ps(); 2]; T];
        for b in 0..blocks {
            let base = lines.as_ptr().add(b * per) as *const u8;
            prefetch_span(base, per * 64, ahead);
            soon.step();
            let at = |line: usize, byte: usize| base.wrapping_add(64 * line + byte);
            let q8: [*const i32; T] = a.map(|a| a.qs.as_ptr().add(b * QK_K) as *const i32);
            for h in 0..2 {
                let d = _mm256_cvtph_ps(_mm_load_si128(at(0, 16 * h).cast()));
                let dmin = _mm256_cvtph_ps(_mm_load_si128(at(0, 32 + 16 * h).cast()));
                let da: [__m256; T] =
                    std::array::from_fn(|t| _mm256_set1_ps(*a[t].d.get_unchecked(b)));
                let dd: [__m256; T] = std::array::from_fn(|t| _mm256_mul_ps(d, da[t]));
                let dm: [__m256; T] = std::array::from_fn(|t| _mm256_mul_ps(dmin, da[t]));
                // Sub-block `s`'s byte of the half's eight rows: the scale in its low nibble,
                // the minimum in its high one, as 32-bit integers.
                let both = |s: usize| {
                    let bytes = at(SCALES + s / 4, (s % 4) * ROWS + HALF * h);
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(bytes.cast()))
                };
                let mut isum = [zero; T];
                let mut imin = [zero; T];
                for part in 0..2 {
                    let mut psum = [zero; T];
                    let mut pmin = [zero; T];
                    for j in 4 * part..4 * part + 4 {
                        let raw = [both(2 * j), both(2 * j + 1)];
                        let scales = raw.map(|r| {
                            let scale = _mm256_and_si256(r, nibble);
                            _mm256_or_si256(scale, _mm256_slli_epi32::<16>(scale))
                        });
                        // The two minimums as a pair of 16-bit integers in each row's lane.
                        let mins = _mm256_or_si256(
                            _mm256_srli_epi32::<4>(raw[0]),
                            _mm256_slli_epi32::<12>(_mm256_and_si256(
                                raw[1],
                                _mm256_set1_epi32(0xF0),
                            )),
                        );
                        let low2 = [0, 1]
                            .map(|k| _mm256_load_si256(at(two_bit_line::<F>(j, k), 32 * h).cast()));
                        for q in 0..8 {
                            // Values 4q..4q + 4 of the chunk, sub-block 2j + q / 4.
                            let bits = _mm256_srl_epi16(
                                low2[q / 4],
                                _mm_cvtsi32_si128(2 * (q % 4) as i32),
                            );
                            let x = _mm256_and_si256(bits, three);
                            for t in 0..T {
                                let y = _mm256_set1_epi32(q8[t].add(8 * j + q).read_unaligned());
                                let p =
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), scales[q / 4]);
                                psum[t] = _mm256_add_epi32(psum[t], p);
                            }
                        }
                        for t in 0..T {
                            let bsums = a[t].bsums.as_ptr().add(b * 16 + 2 * j);
                            let sums = _mm256_set1_epi32(pair16(*bsums, *bsums.add(1)));
                            pmin[t] = _mm256_add_epi32(pmin[t], _mm256_madd_epi16(mins, sums));
                        }
                    }
                    for t in 0..T {
                        if per_half[t] {
                            let (p, m) = (_mm256_cvtepi32_ps(psum[t]), _mm256_cvtepi32_ps(pmin[t]));
                            acc[t][h] = _mm256_fmadd_ps(p, dd[t], acc[t][h]);
                            acc_min[t][h] = _mm256_fmadd_ps(m, dm[t], acc_min[t][h]);
                        } else {
                            isum[t] = _mm256_add_epi32(isum[t], psum[t]);
                            imin[t] = _mm256_add_epi32(imin[t], pmin[t]);
                        }
                    }
                }
                for t in 0..T {
                    if !per_half[t] {
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
