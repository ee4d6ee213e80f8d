//! The sixteen-row kernels with AVX-512 VNNI: a group's sixteen rows are one 512-bit
//! vector per four values, multiplied with the activations in one `vpdpbusd` per step.

use std::arch::x86_64::*;

use super::{place, starts_per_block, unit, Values};
use super::{BlockLanes, Expanded, Kernel, LaneBlock, Line, QUADS, ROWS};
use crate::quant::q8::Q8Row;
use crate::simd::prefetch::{prefetch_span, Upcoming};

/// Group `g`'s sixteen rows against `T` activation rows (`starts`: each one's
/// [`super::lane_starts`] for the matrix's format, none for Q4_1 and Q5_1): `out[t][r]`
/// is row `16g + r` · `a[t]` (zero past the matrix). `soon`: lines to ask the memory for
/// meanwhile ([`Upcoming`]).
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI) must be available
/// ([`crate::simd::vnni`]).
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
        assert_eq!(m.kernel, Kernel::Vnni);
        group_vnni::<T, L>(m.group(g), blocks, a, starts, soon)
    }
}

/// How many lane starts per block this kernel reads for `L`: all of a format whose values
/// are stored above their own ([`super::starts_per_block`]), none of Q4_1's and Q5_1's.
pub const fn starts_taken<L: LaneBlock>() -> usize {
    match L::OFFSET {
        0 => 0,
        _ => starts_per_block::<L>(),
    }
}

/// Group `g` of a Q5_0 matrix written out as the lines of a Q8_0 group, each value 16
/// higher ([`super::expand_q5_0_with`]), for more than two pairs of activation rows
/// ([`dot_expanded`] reads it).
///
/// # Safety
/// As [`dot_group`]'s.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn expand_q5_0<L: LaneBlock>(m: &BlockLanes<L>, g: usize, into: &mut Vec<Line>) {
    assert_eq!(m.kernel, Kernel::Vnni);
    super::expand_q5_0_with(m, g, into, |from, q, to| {
        // SAFETY: AVX-512 as the caller promises; both are 64-byte aligned lines.
        unsafe {
            let to = to as *mut Line as *mut __m512i;
            _mm512_store_si512(to, q5_0_values(from.as_ptr(), q));
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
        // Read as Q8_0's lines; the starts, Q5_0's, cancel its offset.
        group_vnni::<T, Expanded>(lines, blocks, a, starts, soon)
    }
}

/// A Q4_1, Q4_0 or IQ4_NL block's nibbles `4q..4q + 4` of its sixteen rows (Q5_0's and
/// Q5_1's without their fifth bits), unsigned bytes, from
/// its four lines of nibbles at `nibbles` (the low nibbles are values 0..16, the high
/// ones 16..32).
///
/// # Safety
///
/// The CPU has AVX-512 F and BW; `nibbles` points at four readable lines.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn nibble_values(nibbles: *const Line, q: usize) -> __m512i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let low = _mm512_set1_epi8(0x0F);
        let v = _mm512_load_si512(nibbles.add(q % 4) as *const __m512i);
        match q < 4 {
            true => _mm512_and_si512(v, low),
            false => _mm512_and_si512(_mm512_srli_epi16::<4>(v), low),
        }
    }
}

/// A Q5_0 block's values `4q..4q + 4` of its sixteen rows, stored 16 higher (Q5_1's
/// values themselves), from its mask line and four lines of nibbles at `lines`.
///
/// # Safety
///
/// The CPU has AVX-512 F and BW; `lines` points at the mask line and the four lines of
/// nibbles after it, all readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q5_0_values(lines: *const Line, q: usize) -> __m512i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let low = nibble_values(lines.add(1), q);
        let mask = (lines as *const u64).add(q).read();
        _mm512_mask_add_epi8(low, mask, low, _mm512_set1_epi8(0x10))
    }
}

/// IQ4_NL's table ([`crate::quant::iq4::VALUES`]) 128 higher: unsigned bytes, the
/// instruction's unsigned operand.
const IQ4_NL_128: [u8; 16] = {
    let mut table = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        table[i] = (crate::quant::iq4::VALUES[i] as i16 + 128) as u8;
        i += 1;
    }
    table
};

/// [`dot_group`] on a group's lines of format `F`.
/// Per block: the rows' scales times each activation row's (one multiplication per
/// activation row); per group of four values (a line of Q8_0's, or one nibble of a
/// line of Q4_1's or Q5_0's, with Q5_0's and Q5_1's fifth bits added under their mask)
/// and activation row, one integer multiply-add (four activations broadcast), its
/// conversion, and one fused multiply-add into that group's accumulator; Q4_1's and
/// Q5_1's minimums times the activation row's `s` into their own. Q4_0 and IQ4_NL (its
/// nibbles looked up) instead add a block's eight integer multiply-adds into one
/// integer, converted and folded into one accumulator.
///
/// # Safety
///
/// The CPU has AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI); the arguments are [`dot_group`]'s, as its caller guarantees them.
// Indexed loops: each vector of weights goes to every activation row's accumulator.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl,avx512bw")]
unsafe fn group_vnni<const T: usize, L: LaneBlock>(
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
        assert!(group.len() >= blocks.div_ceil(per_unit) * (1 + per_unit * value_lines));
        let mut acc = [[_mm512_setzero_ps(); QUADS]; T];
        let mut extra = [_mm512_setzero_ps(); T];
        let half = |at: *const u8| _mm512_cvtph_ps(_mm256_loadu_si256(at as *const __m256i));
        // IQ4_NL's table in each 128-bit lane (`vpshufb` looks up within one).
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4_NL_128.as_ptr() as *const __m128i));
        let minimums = L::MINIMUMS;
        for b in 0..blocks {
            let (header, at, values) = place::<L>(b);
            if b % per_unit == 0 {
                let unit_lines = 1 + per_unit * value_lines;
                prefetch_span(group.as_ptr().add(header), unit_lines * 64, ahead);
                soon.step();
            }
            let header = group.as_ptr().add(header) as *const u8;
            let lines = group.as_ptr().add(values);
            let d = half(header.add(at));
            let scale: [__m512; T] =
                std::array::from_fn(|t| _mm512_mul_ps(d, _mm512_set1_ps(*a[t].d.get_unchecked(b))));
            if minimums {
                let m = half(header.add(32));
                for t in 0..T {
                    let s = _mm512_set1_ps(*a[t].s.get_unchecked(b));
                    extra[t] = _mm512_fmadd_ps(m, s, extra[t]);
                }
            }
            if L::ONE_SUM {
                // One integer per row and block: it starts from the block's start, and the
                // block's eight multiply-adds all add into it.
                let mut sum: [__m512i; T] =
                    std::array::from_fn(|t| _mm512_set1_epi32(*starts[t].get_unchecked(b)));
                for q in 0..QUADS {
                    let w = match L::VALUES {
                        Values::Table => _mm512_shuffle_epi8(table, nibble_values(lines, q)),
                        _ => nibble_values(lines, q),
                    };
                    for t in 0..T {
                        let four = a[t].qs.as_ptr().add(b * 32 + 4 * q) as *const i32;
                        let y = _mm512_set1_epi32(four.read_unaligned());
                        sum[t] = _mm512_dpbusd_epi32(sum[t], w, y);
                    }
                }
                for t in 0..T {
                    acc[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), scale[t], acc[t][0]);
                }
                continue;
            }
            for q in 0..QUADS {
                let w = match L::VALUES {
                    Values::Bytes => _mm512_load_si512(lines.add(q) as *const __m512i),
                    Values::Nibbles | Values::Table => nibble_values(lines, q),
                    Values::FiveBits => q5_0_values(lines, q),
                };
                for t in 0..T {
                    let four = a[t].qs.as_ptr().add(b * 32 + 4 * q) as *const i32;
                    let start = match minimums {
                        true => _mm512_setzero_si512(),
                        false => _mm512_set1_epi32(*starts[t].get_unchecked(b * QUADS + q)),
                    };
                    let y = _mm512_set1_epi32(four.read_unaligned());
                    let lane = _mm512_dpbusd_epi32(start, w, y);
                    acc[t][q] = _mm512_fmadd_ps(scale[t], _mm512_cvtepi32_ps(lane), acc[t][q]);
                }
            }
        }
        let mut out = [[0f32; ROWS]; T];
        for t in 0..T {
            let l = &acc[t];
            if L::ONE_SUM {
                // Their one accumulator per row.
                _mm512_storeu_ps(out[t].as_mut_ptr(), l[0]);
                continue;
            }
            // hsum_float_8: lanes i and i + 4 first, then (0 + 2) + (1 + 3); then Q4_1's
            // and Q5_1's minimums (none for the others).
            let even = _mm512_add_ps(_mm512_add_ps(l[0], l[4]), _mm512_add_ps(l[2], l[6]));
            let odd = _mm512_add_ps(_mm512_add_ps(l[1], l[5]), _mm512_add_ps(l[3], l[7]));
            let sum = _mm512_add_ps(even, odd);
            let sum = if minimums {
                _mm512_add_ps(sum, extra[t])
            } else {
                sum
            };
            _mm512_storeu_ps(out[t].as_mut_ptr(), sum);
        }
        out
    }
}
