//! The sixteen-row K-quant layout's Q2_K and Q3_K kernels for CPUs with AVX-512 VNNI: a
//! whole line (sixteen rows, one per 32-bit lane) is one vector, and four values of
//! sixteen rows times four broadcast activations are one `vpdpbusd`, whose first operand
//! is unsigned bytes:
//! - Q2_K's values (0..=3) are;
//! - Q3_K's (three bits less 4) are taken as their three bits, 4 higher, and the sum
//!   starts from `-4 ·` the activations' sum (per sub-block of 16 from the activation row's
//!   `bsums` for the tiled plan; per four values for the dot product's, whose lanes are
//!   groups of four: summed once per super-block by the same instruction against ones),
//!   so that the integer it ends with is the products' exact sum.
//!
//! The sums are then multiplied by their sub-block's scales (a 16-bit multiply-add: they
//! fit in 16 bits); the AVX2 kernels apply the scale inside their 16-bit multiply-add
//! instead. Both are exact integers in the same lanes, and the floating-point steps are
//! the AVX2 kernels', so the results are bit-identical.

use std::arch::x86_64::*;

use super::{block_lines, chunk_line, two_bit_line, Bits, KLane};
use super::{KLanes, Line, ROWS, SCALES};
use crate::quant::formats::{q2_k::Q2K, q3_k::Q3K};
use crate::quant::q8k::Q8KRow;
use crate::quant::q8k::QK_K;
use crate::quant::RowKernel;
use crate::simd::int_lanes::pair16;
use crate::simd::prefetch::{prefetch_span, Upcoming};

/// Group `g`'s sixteen Q2_K rows against `T` activation rows, each rounded as its kernel
/// says (llama.cpp's repacked Q2_K kernels, `crate::quant::formats::q2_k::dot_repacked`): `out[t][r]` is
/// row `16g + r` · `a[t]` (zero past the matrix). `soon`: lines to ask the memory for
/// meanwhile ([`Upcoming`]).
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI) must be available
/// ([`crate::simd::vnni`]).
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
        // Its lines are Q2_K's.
        assert!(F::BITS == Bits::Two, "{} is not Q2_K", F::NAME);
        assert!(a.iter().all(|row| row.has_blocks(m.blocks)));
        group_q2k_vnni(m.group(g), m.blocks, a, kernels, soon)
    }
}

/// [`dot_group_q2k`] on a group's lines: the plan of the AVX2 kernel
/// (`avx2::group_q2k_avx2`) on all sixteen rows at once. Per half super-block and
/// activation row, the values' products by the sub-blocks' scales in one integer sum, the
/// minimums by the activations' sums in another, then the floating-point steps of
/// `formats::kquant::PairSums` (per half for a row of a four-row group, per super-block otherwise).
///
/// # Safety
///
/// The CPU has AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI); the arguments are [`dot_group_q2k`]'s, as its caller guarantees
/// them.
// Indexed loops: each vector of weights goes to every activation row's sums.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl,avx512bw")]
unsafe fn group_q2k_vnni<const T: usize>(
    lines: &[Line],
    blocks: usize,
    a: [&Q8KRow; T],
    kernels: [RowKernel; T],
    mut soon: Upcoming,
) -> [[f32; ROWS]; T] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let per = block_lines::<Q2K>();
        let ahead = crate::simd::cpu::prefetch_ahead();
        assert!(lines.len() >= blocks * per);
        let per_half = kernels.map(RowKernel::in_group_of_four);
        let zero = _mm512_setzero_si512();
        let (three, nibble) = (_mm512_set1_epi8(3), _mm512_set1_epi32(0x0F));
        let mut acc = [_mm512_setzero_ps(); T];
        let mut acc_min = [_mm512_setzero_ps(); T];
        for b in 0..blocks {
            let base = lines.as_ptr().add(b * per) as *const u8;
            prefetch_span(base, per * 64, ahead);
            soon.step();
            let at = |line: usize, byte: usize| base.wrapping_add(64 * line + byte);
            let q8: [*const i32; T] = a.map(|a| a.qs.as_ptr().add(b * QK_K) as *const i32);
            let d = _mm512_cvtph_ps(_mm256_load_si256(at(0, 0).cast()));
            let dmin = _mm512_cvtph_ps(_mm256_load_si256(at(0, 32).cast()));
            let da: [__m512; T] = std::array::from_fn(|t| _mm512_set1_ps(*a[t].d.get_unchecked(b)));
            // Sub-block `s`'s byte of the sixteen rows: the scale in its low nibble, the
            // minimum in its high one, as 32-bit integers.
            let both = |s: usize| {
                let bytes = at(SCALES + s / 4, (s % 4) * ROWS);
                _mm512_cvtepu8_epi32(_mm_load_si128(bytes.cast()))
            };
            let mut isum = [zero; T];
            let mut imin = [zero; T];
            for part in 0..2 {
                let mut psum = [zero; T];
                let mut pmin = [zero; T];
                for j in 4 * part..4 * part + 4 {
                    let raw = [both(2 * j), both(2 * j + 1)];
                    // Each scale in its lane's low 16 bits, zero above.
                    let scales = raw.map(|r| _mm512_and_si512(r, nibble));
                    // The two minimums as a pair of 16-bit integers in each row's lane.
                    let mins = _mm512_or_si512(
                        _mm512_srli_epi32::<4>(raw[0]),
                        _mm512_slli_epi32::<12>(_mm512_and_si512(raw[1], _mm512_set1_epi32(0xF0))),
                    );
                    let low2 =
                        [0, 1].map(|k| _mm512_load_si512(at(two_bit_line::<Q2K>(j, k), 0).cast()));
                    // Sub-block 2j + k: quads 4k..4k + 4 of the chunk, in line k.
                    for k in 0..2 {
                        let mut dot = [zero; T];
                        for q in 0..4 {
                            let bits = _mm512_srl_epi16(low2[k], _mm_cvtsi32_si128(2 * q as i32));
                            let x = _mm512_and_si512(bits, three);
                            for t in 0..T {
                                let y = _mm512_set1_epi32(
                                    q8[t].add(8 * j + 4 * k + q).read_unaligned(),
                                );
                                dot[t] = _mm512_dpbusd_epi32(dot[t], x, y);
                            }
                        }
                        for t in 0..T {
                            psum[t] =
                                _mm512_add_epi32(psum[t], _mm512_madd_epi16(dot[t], scales[k]));
                        }
                    }
                    for t in 0..T {
                        let bsums = a[t].bsums.as_ptr().add(b * 16 + 2 * j);
                        let sums = _mm512_set1_epi32(pair16(*bsums, *bsums.add(1)));
                        pmin[t] = _mm512_add_epi32(pmin[t], _mm512_madd_epi16(mins, sums));
                    }
                }
                for t in 0..T {
                    if per_half[t] {
                        let (dd, dm) = (_mm512_mul_ps(d, da[t]), _mm512_mul_ps(dmin, da[t]));
                        let (p, m) = (_mm512_cvtepi32_ps(psum[t]), _mm512_cvtepi32_ps(pmin[t]));
                        acc[t] = _mm512_fmadd_ps(p, dd, acc[t]);
                        acc_min[t] = _mm512_fmadd_ps(m, dm, acc_min[t]);
                    } else {
                        isum[t] = _mm512_add_epi32(isum[t], psum[t]);
                        imin[t] = _mm512_add_epi32(imin[t], pmin[t]);
                    }
                }
            }
            for t in 0..T {
                if !per_half[t] {
                    let (dd, dm) = (_mm512_mul_ps(d, da[t]), _mm512_mul_ps(dmin, da[t]));
                    let (s, m) = (_mm512_cvtepi32_ps(isum[t]), _mm512_cvtepi32_ps(imin[t]));
                    acc[t] = _mm512_fmadd_ps(s, dd, acc[t]);
                    acc_min[t] = _mm512_fmadd_ps(m, dm, acc_min[t]);
                }
            }
        }
        let mut out = [[0f32; ROWS]; T];
        for t in 0..T {
            _mm512_storeu_ps(out[t].as_mut_ptr(), _mm512_sub_ps(acc[t], acc_min[t]));
        }
        out
    }
}

/// Group `g`'s sixteen Q3_K rows against `T` activation rows: `out[t][r]` is row `16g + r`
/// · `a[t]` (zero past the matrix), with the tiled matmul's arithmetic where `TILED`, the
/// dot product's (one activation row, `T` = 1) otherwise, as the AVX2 kernel
/// (`avx2::dot_group`). `soon`: lines to ask the memory for meanwhile ([`Upcoming`]).
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI) must be available
/// ([`crate::simd::vnni`]).
pub unsafe fn dot_group_q3k<const T: usize, const TILED: bool, F: KLane>(
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
        // Its lines are Q3_K's.
        assert!(F::BITS == Bits::Three, "{} is not Q3_K", F::NAME);
        assert!(a.iter().all(|row| row.has_blocks(m.blocks)));
        group_q3k_vnni::<T, TILED>(m.group(g), m.blocks, a, soon)
    }
}

/// [`dot_group_q3k`] on a group's lines. Per sub-block of 16 and activation row: its four
/// groups of four values (each three bits, 4 higher) times four activations, one
/// `vpdpbusd` each from the group's or the sub-block's start, then times the sub-block's
/// scales; into one integer per super-block (tiled) or eight, one per group of four of
/// every chunk (the dot product's lanes).
///
/// # Safety
///
/// The CPU has AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI); the arguments are [`dot_group_q3k`]'s, as its caller guarantees
/// them.
// Indexed loops: each vector of weights goes to every activation row's sums.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl,avx512bw")]
unsafe fn group_q3k_vnni<const T: usize, const TILED: bool>(
    lines: &[Line],
    blocks: usize,
    a: [&Q8KRow; T],
    mut soon: Upcoming,
) -> [[f32; ROWS]; T] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let per = block_lines::<Q3K>();
        let ahead = crate::simd::cpu::prefetch_ahead();
        assert!(lines.len() >= blocks * per);
        let zero = _mm512_setzero_si512();
        let (three, four, ones) = (
            _mm512_set1_epi8(3),
            _mm512_set1_epi8(4),
            _mm512_set1_epi8(1),
        );
        let low16 = _mm512_set1_epi32(0xFFFF);
        let mut tiled = [_mm512_setzero_ps(); T];
        let mut acc = [_mm512_setzero_ps(); 8];
        // The dot product's starts: -4 · each group of four activations' sum, per super-block.
        let mut starts = Aligned([0i32; QK_K / 4]);
        for b in 0..blocks {
            let base = lines.as_ptr().add(b * per) as *const u8;
            prefetch_span(base, per * 64, ahead);
            soon.step();
            let at = |line: usize, byte: usize| base.wrapping_add(64 * line + byte);
            let load = |line: usize| _mm512_load_si512(at(line, 0).cast());
            let q8: [*const i32; T] = a.map(|a| a.qs.as_ptr().add(b * QK_K) as *const i32);
            if !TILED {
                let qs = a[0].qs.as_ptr().add(b * QK_K);
                for k in 0..QK_K / 64 {
                    let y = _mm512_loadu_si512(qs.add(64 * k).cast());
                    let sums = _mm512_dpbusd_epi32(zero, ones, y);
                    let start = _mm512_sub_epi32(zero, _mm512_slli_epi32::<2>(sums));
                    _mm512_store_si512(starts.0.as_mut_ptr().add(16 * k).cast(), start);
                }
            }
            let d = _mm512_cvtph_ps(_mm256_load_si256(at(0, 0).cast()));
            let mut lanes = [[zero; 8]; T];
            for j in 0..8 {
                let top = load(chunk_line::<Q3K>(j));
                let low2 = [0, 1].map(|k| load(two_bit_line::<Q3K>(j, k)));
                // Sub-block 2j + k: groups of four 4k..4k + 4 of the chunk.
                for k in 0..2 {
                    let s = 2 * j + k;
                    let scale = at(SCALES + s / 4, (s % 4) * ROWS);
                    let scale = _mm512_cvtepi8_epi32(_mm_load_si128(scale.cast()));
                    // The scale in each lane's low 16 bits, zero above.
                    let scale = _mm512_and_si512(scale, low16);
                    let mut sub: [__m512i; T] = std::array::from_fn(|t| match TILED {
                        true => _mm512_set1_epi32(-4 * *a[t].bsums.get_unchecked(b * 16 + s)),
                        false => zero,
                    });
                    for i in 0..4 {
                        let q = 4 * k + i;
                        let bits = _mm512_srl_epi16(low2[k], _mm_cvtsi32_si128(2 * i as i32));
                        let high = _mm512_test_epi8_mask(top, _mm512_set1_epi8(1 << q));
                        let low = _mm512_and_si512(bits, three);
                        let u = _mm512_mask_add_epi8(low, high, low, four);
                        for t in 0..T {
                            let y = _mm512_set1_epi32(q8[t].add(8 * j + q).read_unaligned());
                            match TILED {
                                true => sub[t] = _mm512_dpbusd_epi32(sub[t], u, y),
                                false => {
                                    let start =
                                        _mm512_set1_epi32(*starts.0.get_unchecked(8 * j + q));
                                    let dot = _mm512_dpbusd_epi32(start, u, y);
                                    let p = _mm512_madd_epi16(dot, scale);
                                    lanes[t][q] = _mm512_add_epi32(lanes[t][q], p);
                                }
                            }
                        }
                    }
                    if TILED {
                        for t in 0..T {
                            let p = _mm512_madd_epi16(sub[t], scale);
                            lanes[t][0] = _mm512_add_epi32(lanes[t][0], p);
                        }
                    }
                }
            }
            for t in 0..T {
                let da = _mm512_set1_ps(*a[t].d.get_unchecked(b));
                if TILED {
                    let result = _mm512_mul_ps(_mm512_cvtepi32_ps(lanes[t][0]), d);
                    tiled[t] = _mm512_fmadd_ps(result, da, tiled[t]);
                } else {
                    let dd = _mm512_mul_ps(da, d);
                    for (acc, &lane) in acc.iter_mut().zip(&lanes[t]) {
                        *acc = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(lane), *acc);
                    }
                }
            }
        }
        let mut out = [[0f32; ROWS]; T];
        for t in 0..T {
            let sum = match TILED {
                true => tiled[t],
                // hsum_float_8, one weight row per vector lane.
                false => {
                    let r = [0, 1, 2, 3].map(|i| _mm512_add_ps(acc[i], acc[i + 4]));
                    _mm512_add_ps(_mm512_add_ps(r[0], r[2]), _mm512_add_ps(r[1], r[3]))
                }
            };
            _mm512_storeu_ps(out[t].as_mut_ptr(), sum);
        }
        out
    }
}

/// A super-block's starts, aligned for 512-bit stores.
#[repr(align(64))]
struct Aligned([i32; QK_K / 4]);
