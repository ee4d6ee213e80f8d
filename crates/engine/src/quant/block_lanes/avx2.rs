//! The sixteen-row block-of-32 layout's kernel for CPUs with AVX2 but without AVX-512
//! VNNI. Each 64-byte line is two 256-bit halves of eight rows each (row `r`'s four bytes
//! at `4r`), so a half is one AVX2 vector with one weight row per 32-bit lane, and the
//! kernel runs the VNNI kernel's plan on it: four activations broadcast against four
//! values of eight rows, the lane's integer converted and folded into that lane's float
//! accumulator, no horizontal sums across rows.
//!
//! Without `vpdpbusd`, four values times four activations is `vpmaddubsw` (pairs of
//! products as 16-bit sums) then `vpmaddwd` by ones. The first multiplies unsigned bytes by
//! signed ones and saturates past 32,767, so:
//! - Q8_0's values (stored 128 higher) are flipped back to signed ones and multiplied as
//!   llama.cpp's AVX2 kernels do, `|w|` by the activations with `w`'s signs: at most
//!   2 · 128 · 127, for activations in -127..=127, which is all the quantizer makes of
//!   finite values (an activation of -128 would be negated to itself); no lane starts
//!   are needed;
//! - Q4_1's, Q5_0's and Q4_0's values are small unsigned ones already (at most
//!   2 · 31 · 128), taken as the VNNI kernel takes them (Q5_0's and Q4_0's with their lane
//!   starts);
//! - Q4_0's eight pairs of a block add up in 16 bits (at most 16 · 15 · 128) before one
//!   `vpmaddwd`: its one integer per row and block.
//! - Q5_1's values are Q5_0's five bits, unsigned, with Q4_1's minimums.
//! - IQ4_NL's indices are looked up (`vpshufb`) as signed values, multiplied as Q8_0's
//!   (at most 2 · 127 · 127 a pair, for activations in -127..=127), and each group of four's integer added into the
//!   block's one integer per row (its sixteen pairs would overflow 16 bits).
//!
//! The integers are the exact sums the VNNI kernel computes, and the floating-point steps
//! are its own, lane for lane (for Q5_1 and IQ4_NL, those of their portable kernels), so
//! results are bit-identical to the portable kernels.
//!
//! Eight accumulators per row and activation row (one per group of four values, as
//! llama.cpp's) fill half the sixteen registers for one half and one activation row, so
//! the kernel takes a group one half at a time, the second from the cache; Q4_0 and IQ4_NL,
//! with one accumulator, take up to four activation rows a pass.

use std::arch::x86_64::*;

use super::{place, starts_per_block, unit, Values};
use super::{BlockLanes, Expanded, Kernel, LaneBlock, Line, QUADS, ROWS};
use crate::quant::iq4;
use crate::quant::q8::Q8Row;
use crate::simd::int_lanes::lanes_avx2;
use crate::simd::prefetch::{prefetch_span, Upcoming};

/// Rows per half line (one per 32-bit lane of a 256-bit vector).
const HALF: usize = ROWS / 2;

/// Group `g`'s sixteen rows against `T` activation rows (`starts`: each one's
/// [`super::lane_starts`] for Q5_0 and Q4_0; the others take none): `out[t][r]` is row
/// `16g + r` · `a[t]` (zero past the matrix). `soon`: lines to ask the memory for
/// meanwhile ([`Upcoming`]).
///
/// # Safety
/// AVX2, FMA and F16C must be available ([`crate::simd::avx2`]). For Q8_0 and
/// IQ4_NL the activations must lie in -127..=127 to be exact, as [`crate::quant::q8::quantize_row`]
/// makes them of finite values.
pub unsafe fn dot_group<const T: usize, L: LaneBlock>(
    m: &BlockLanes<L>,
    g: usize,
    a: [&Q8Row; T],
    starts: [&[i32]; T],
    soon: Upcoming,
) -> [[f32; ROWS]; T] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let blocks = m.blocks;
        assert!(super::rows_cover(&a, &starts, blocks, starts_taken::<L>()));
        assert_eq!(m.kernel, Kernel::Avx2);
        group_avx2::<T, L>(m.group(g), blocks, a, starts, soon)
    }
}

/// How many lane starts per block this kernel reads for `L`: those of a format whose
/// values are stored above their own (Q5_0's eight, Q4_0's one), but for values 128 higher,
/// which it makes signed instead ([`signed`]); Q4_1 and Q5_1 have none.
pub const fn starts_taken<L: LaneBlock>() -> usize {
    match L::OFFSET {
        0 | 128 => 0,
        _ => starts_per_block::<L>(),
    }
}

/// Whether this kernel multiplies `L`'s values as signed bytes, as llama.cpp's AVX2
/// kernels do (values stored 128 higher: Q8_0's flipped back, IQ4_NL's looked up in the
/// signed table).
const fn signed<L: LaneBlock>() -> bool {
    L::OFFSET == 128
}

/// Group `g` of a Q5_0 matrix written out as the lines of a Q8_0 group, each value 16
/// higher ([`super::expand_q5_0_with`]), for more than one activation row ([`dot_expanded`]
/// reads it).
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
pub unsafe fn expand_q5_0<L: LaneBlock>(m: &BlockLanes<L>, g: usize, into: &mut Vec<Line>) {
    assert_eq!(m.kernel, Kernel::Avx2);
    super::expand_q5_0_with(m, g, into, |from, q, to| {
        for h in 0..2 {
            // SAFETY: AVX2 as the caller promises; both are 64-byte aligned lines.
            unsafe {
                let to = (to as *mut Line as *mut u8).add(32 * h) as *mut __m256i;
                _mm256_store_si256(to, q5_0_values(from.as_ptr(), q, h));
            }
        }
    });
}

/// The sixteen rows of a group that [`expand_q5_0`] wrote, `lines` (of a matrix of
/// `blocks` blocks a row), against `T` activation rows (their Q5_0 starts): as
/// [`dot_group`] on the group it came from, bit for bit (`soon` as there).
///
/// # Safety
/// As [`dot_group`]'s.
pub unsafe fn dot_expanded<const T: usize>(
    lines: &[Line],
    blocks: usize,
    a: [&Q8Row; T],
    starts: [&[i32]; T],
    soon: Upcoming,
) -> [[f32; ROWS]; T] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        assert!(super::rows_cover(&a, &starts, blocks, QUADS));
        group_avx2::<T, Expanded>(lines, blocks, a, starts, soon)
    }
}

/// Half `h` of a block's nibbles `4q..4q + 4` (its eight rows), unsigned bytes, from its
/// four lines of nibbles at `nibbles`: Q4_1's, Q4_0's and IQ4_NL's, and the low four bits
/// of Q5_0's and Q5_1's values.
///
/// # Safety
///
/// The CPU has AVX2; `nibbles` points at four readable lines.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibble_values(nibbles: *const Line, q: usize, h: usize) -> __m256i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let v = _mm256_load_si256((nibbles.add(q % 4) as *const u8).add(32 * h).cast());
        let v = match q < 4 {
            true => v,
            false => _mm256_srli_epi16::<4>(v),
        };
        _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
    }
}

/// Half `h` of a Q5_0 block's values `4q..4q + 4`, stored 16 higher (a Q5_1 block's
/// values), from its plane of fifth bits ([`super::Kernel::Avx2`]'s) and four lines of
/// nibbles at `lines`: each byte's bit `2q` (a low nibble's) or `2(q - 4) + 1` (a high
/// one's) shifted to 16. A 16-bit shift by at most four moves no bit of one byte into
/// the other's bit 4.
///
/// # Safety
///
/// The CPU has AVX2; `lines` points at the plane of fifth bits and the four lines of
/// nibbles after it, all readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q5_0_values(lines: *const Line, q: usize, h: usize) -> __m256i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let low = nibble_values(lines.add(1), q, h);
        let plane = _mm256_load_si256((lines as *const u8).add(32 * h).cast());
        let at_16 = match q {
            0 => _mm256_slli_epi16::<4>(plane),
            1 => _mm256_slli_epi16::<2>(plane),
            2 => plane,
            3 => _mm256_srli_epi16::<2>(plane),
            4 => _mm256_slli_epi16::<3>(plane),
            5 => _mm256_slli_epi16::<1>(plane),
            6 => _mm256_srli_epi16::<1>(plane),
            _ => _mm256_srli_epi16::<3>(plane),
        };
        _mm256_or_si256(low, _mm256_and_si256(at_16, _mm256_set1_epi8(0x10)))
    }
}

/// Half `h` of sixteen f16 values at `p` (eight rows' scales or minimums), as f32.
///
/// # Safety
///
/// The CPU has AVX2 and F16C; `p` points at sixteen readable f16 values.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn half_f16(p: *const u8, h: usize) -> __m256 {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * h) as *const __m128i)) }
}

/// Activations `4q..4q + 4` of block `b` of `a`, in every 32-bit lane.
///
/// # Safety
///
/// The CPU has AVX2; block `b` is one of `a`'s and `q < 8`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn broadcast_four(a: &Q8Row, b: usize, q: usize) -> __m256i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let four = a.qs.as_ptr().add(b * 32 + 4 * q) as *const i32;
        _mm256_set1_epi32(four.read_unaligned())
    }
}

/// [`dot_group`] on a group's lines of format `L`, one half (eight rows) after the other.
/// Per block: the half's scales times each activation row's; per group of four values and
/// activation row, the lane's exact integer (see the module), its conversion, and one
/// fused multiply-add into that group's accumulator (Q4_0's and IQ4_NL's: per block, into
/// their one); Q4_1's and Q5_1's minimums times the activation row's `s` into their own.
///
/// # Safety
///
/// The CPU has AVX2, FMA and F16C; the arguments are [`dot_group`]'s, as its caller
/// guarantees them.
// Indexed loops: each vector of weights goes to every activation row's accumulator.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<const T: usize, L: LaneBlock>(
    group: &[Line],
    blocks: usize,
    a: [&Q8Row; T],
    starts: [&[i32]; T],
    mut soon: Upcoming,
) -> [[f32; ROWS]; T] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let ahead = crate::simd::cpu::prefetch_ahead();
        let (per_unit, value_lines) = unit::<L>();
        let unit_lines = 1 + per_unit * value_lines;
        assert!(group.len() >= blocks.div_ceil(per_unit) * unit_lines);
        let flip = _mm256_set1_epi8(-128);
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(iq4::VALUES.as_ptr().cast()));
        let mut out = [[0f32; ROWS]; T];
        for h in 0..2 {
            let mut acc = [[_mm256_setzero_ps(); QUADS]; T];
            let mut extra = [_mm256_setzero_ps(); T];
            for b in 0..blocks {
                let (header, at, values) = place::<L>(b);
                if h == 0 && b % per_unit == 0 {
                    // The first half streams the group; the second finds it in the cache.
                    prefetch_span(group.as_ptr().add(header), unit_lines * 64, ahead);
                    soon.step();
                }
                let header = group.as_ptr().add(header) as *const u8;
                let lines = group.as_ptr().add(values);
                let d = half_f16(header.add(at), h);
                let mut scale = [d; T];
                for t in 0..T {
                    scale[t] = _mm256_mul_ps(d, _mm256_set1_ps(*a[t].d.get_unchecked(b)));
                }
                if L::MINIMUMS {
                    let m = half_f16(header.add(32), h);
                    for t in 0..T {
                        let s = _mm256_set1_ps(*a[t].s.get_unchecked(b));
                        extra[t] = _mm256_fmadd_ps(m, s, extra[t]);
                    }
                }
                if L::ONE_SUM && matches!(L::VALUES, Values::Nibbles) {
                    // The block's pairs in 16 bits, then one integer per row.
                    let mut pairs = [_mm256_setzero_si256(); T];
                    for q in 0..QUADS {
                        let w = nibble_values(lines, q, h);
                        for t in 0..T {
                            let y = broadcast_four(a[t], b, q);
                            pairs[t] = _mm256_add_epi16(pairs[t], _mm256_maddubs_epi16(w, y));
                        }
                    }
                    for t in 0..T {
                        let start = _mm256_set1_epi32(*starts[t].get_unchecked(b));
                        let sum = _mm256_madd_epi16(pairs[t], _mm256_set1_epi16(1));
                        let sum = _mm256_cvtepi32_ps(_mm256_add_epi32(start, sum));
                        acc[t][0] = _mm256_fmadd_ps(sum, scale[t], acc[t][0]);
                    }
                    continue;
                }
                if L::ONE_SUM && matches!(L::VALUES, Values::Table) {
                    // Each group of four's integer, as Q8_0's, into the block's one per row.
                    let mut sum = [_mm256_setzero_si256(); T];
                    for q in 0..QUADS {
                        let w = _mm256_shuffle_epi8(table, nibble_values(lines, q, h));
                        let x = _mm256_sign_epi8(w, w);
                        for t in 0..T {
                            let y = _mm256_sign_epi8(broadcast_four(a[t], b, q), w);
                            sum[t] = _mm256_add_epi32(sum[t], lanes_avx2(x, y));
                        }
                    }
                    for t in 0..T {
                        let sum = _mm256_cvtepi32_ps(sum[t]);
                        acc[t][0] = _mm256_fmadd_ps(sum, scale[t], acc[t][0]);
                    }
                    continue;
                }
                for q in 0..QUADS {
                    // Q8_0's and the expanded lines: line `q`'s half (the nibble formats have
                    // fewer lines, so the address is only made for these).
                    let line = || (lines.add(q) as *const u8).add(32 * h) as *const __m256i;
                    let w = match L::VALUES {
                        Values::Bytes if signed::<L>() => {
                            _mm256_xor_si256(_mm256_load_si256(line()), flip)
                        }
                        Values::Bytes => _mm256_load_si256(line()),
                        Values::Nibbles => nibble_values(lines, q, h),
                        Values::FiveBits => q5_0_values(lines, q, h),
                        Values::Table => unreachable!("taken above"),
                    };
                    let x = match signed::<L>() {
                        true => _mm256_sign_epi8(w, w),
                        false => w,
                    };
                    for t in 0..T {
                        let y = broadcast_four(a[t], b, q);
                        let y = match signed::<L>() {
                            true => _mm256_sign_epi8(y, w),
                            false => y,
                        };
                        let lane = lanes_avx2(x, y);
                        let lane = match starts_taken::<L>() {
                            0 => lane,
                            _ => {
                                let start = *starts[t].get_unchecked(b * QUADS + q);
                                _mm256_add_epi32(_mm256_set1_epi32(start), lane)
                            }
                        };
                        acc[t][q] = _mm256_fmadd_ps(scale[t], _mm256_cvtepi32_ps(lane), acc[t][q]);
                    }
                }
            }
            for t in 0..T {
                let l = &acc[t];
                let sum = match L::ONE_SUM {
                    // Their one accumulator per row.
                    true => l[0],
                    // hsum_float_8: lanes i and i + 4 first, then (0 + 2) + (1 + 3); then
                    // Q4_1's and Q5_1's minimums (none for the others).
                    false => {
                        let even =
                            _mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6]));
                        let odd =
                            _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7]));
                        let sum = _mm256_add_ps(even, odd);
                        match L::MINIMUMS {
                            true => _mm256_add_ps(sum, extra[t]),
                            false => sum,
                        }
                    }
                };
                _mm256_storeu_ps(out[t].as_mut_ptr().add(HALF * h), sum);
            }
        }
        out
    }
}
