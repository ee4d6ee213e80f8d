//! AVX2 and AVX-512 VNNI kernels for weights in the eight-row layout of
//! [`super`]: per block column, one conversion gives the eight rows' scales (and
//! Q4_1's minimums), one multiplication their products with an activation row's scale,
//! and one fused multiply-add Q4_1's minimum terms; each (weight row, activation row) pair
//! then accumulates exactly as the family's `dot` does. The kernels are generic over the
//! format ([`Packed`]), one loop compiled per format; the VNNI kernels work on 512-bit
//! vectors holding two pairs' eight lanes each.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::{Packed, GROUP};
use crate::quant::act_tile::{ActTile, TILE_ROWS};
use crate::quant::formats::block32::block_bytes;
use crate::quant::q8::Q8Row;
use crate::simd::convert::f16_at_ptr;
use crate::simd::int_lanes::{bit_bytes, lanes_avx2, nibbles};
use crate::simd::prefetch::prefetch_span;
use crate::simd::reduce::hsum_m256;

/// Products of `R` of one group's rows, from row `first` on (`blocks` block columns at
/// `group`), with `N` activation rows, with VNNI where the CPU has it.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `group` holds `blocks` columns, every activation
/// row at least `blocks` blocks, and `first + R <= GROUP`.
pub unsafe fn dot_group<const N: usize, const R: usize, F: Packed>(
    group: &[u8],
    blocks: usize,
    first: usize,
    a: [&Q8Row; N],
) -> [[f32; N]; R] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        assert!(group.len() >= blocks * GROUP * block_bytes::<F>() && first + R <= GROUP);
        if crate::simd::vnni() {
            group_vnni::<N, R, F>(group, blocks, first, a)
        } else {
            group_avx2::<N, R, F>(group, blocks, first, a)
        }
    }
}

/// Row `i`'s 32 values of one block column: as unsigned bytes (absolute values for a
/// signed format) and, for a signed format, the values themselves.
///
/// # Safety
/// The CPU must have AVX2; `column` is a block column of the group's layout and `i` is
/// below `GROUP`.
#[inline(always)]
unsafe fn values<F: Packed>(column: *const u8, i: usize) -> (__m256i, Option<__m256i>) {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let x = F::column_values(column, i);
        match F::SIGNED {
            true => (_mm256_sign_epi8(x, x), Some(x)),
            false => (x, None),
        }
    }
}

/// [`dot_group`] with AVX2 alone.
///
/// # Safety
/// As for [`dot_group`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<const N: usize, const R: usize, F: Packed>(
    group: &[u8],
    blocks: usize,
    first: usize,
    a: [&Q8Row; N],
) -> [[f32; N]; R] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let ahead = crate::simd::cpu::prefetch_ahead();
        let stride = GROUP * block_bytes::<F>();
        let minimums = !F::SIGNED;
        let mut acc = [[_mm256_setzero_ps(); N]; R];
        // Q4_1's Σ m·s, one lane per weight row.
        let mut extra = [_mm256_setzero_ps(); N];
        for b in 0..blocks {
            let column = group.as_ptr().add(b * stride);
            prefetch_span(column, stride, ahead);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(column as *const __m128i));
            let m = if minimums {
                _mm256_cvtph_ps(_mm_loadu_si128(column.add(GROUP * 2) as *const __m128i))
            } else {
                _mm256_setzero_ps()
            };
            let mut dd = [_mm256_setzero_ps(); N];
            let mut y = [_mm256_setzero_si256(); N];
            for r in 0..N {
                dd[r] = _mm256_mul_ps(d, _mm256_set1_ps(*a[r].d.get_unchecked(b)));
                y[r] = _mm256_loadu_si256(a[r].qs.as_ptr().add(b * 32) as *const __m256i);
                if minimums {
                    let s = _mm256_set1_ps(*a[r].s.get_unchecked(b));
                    extra[r] = _mm256_fmadd_ps(m, s, extra[r]);
                }
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let (x, sign) = values::<F>(column, first + i);
                let lane = _mm256_set1_epi32((first + i) as i32);
                for r in 0..N {
                    let y = match sign {
                        Some(s) => _mm256_sign_epi8(y[r], s),
                        None => y[r],
                    };
                    let scale = _mm256_permutevar8x32_ps(dd[r], lane);
                    acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(lanes_avx2(x, y)), acc[r]);
                }
            }
        }
        let mut out = [[0f32; N]; R];
        for r in 0..N {
            let mut minimum = [0f32; GROUP];
            _mm256_storeu_ps(minimum.as_mut_ptr(), extra[r]);
            for i in 0..R {
                out[i][r] = hsum_m256(acc[i][r]) + minimum[first + i];
            }
        }
        out
    }
}

/// Products of weight rows `first..first + M` of one group with `N` activation rows, for
/// prompts: each weight block is decoded once for the `N` rows and each activation block
/// loaded once for the `M`, with AVX2 (CPUs with AVX-512 VNNI take [`dot_pair_tile`]).
///
/// # Safety
/// As for [`dot_group`], with `first + M <= GROUP`.
pub unsafe fn dot_rows<const M: usize, const N: usize, F: Packed>(
    group: &[u8],
    blocks: usize,
    first: usize,
    a: [&Q8Row; N],
) -> [[f32; N]; M] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        assert!(group.len() >= blocks * GROUP * block_bytes::<F>() && first + M <= GROUP);
        rows_avx2::<M, N, F>(group, blocks, first, a)
    }
}

/// [`dot_rows`] with AVX2 alone.
///
/// # Safety
/// As for [`dot_rows`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2<const M: usize, const N: usize, F: Packed>(
    group: &[u8],
    blocks: usize,
    first: usize,
    a: [&Q8Row; N],
) -> [[f32; N]; M] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let stride = GROUP * block_bytes::<F>();
        let minimums = !F::SIGNED;
        let mut acc = [[_mm256_setzero_ps(); N]; M];
        let mut extra = [[0f32; N]; M];
        for b in 0..blocks {
            let column = group.as_ptr().add(b * stride);
            let x: [(__m256i, Option<__m256i>); M] =
                std::array::from_fn(|i| values::<F>(column, first + i));
            let d: [f32; M] = std::array::from_fn(|i| f16_at_ptr(column.add((first + i) * 2)));
            let m: [f32; M] = std::array::from_fn(|i| {
                if minimums {
                    f16_at_ptr(column.add(GROUP * 2 + (first + i) * 2))
                } else {
                    0.0
                }
            });
            for r in 0..N {
                let y = _mm256_loadu_si256(a[r].qs.as_ptr().add(b * 32) as *const __m256i);
                let da = *a[r].d.get_unchecked(b);
                for i in 0..M {
                    let y = match x[i].1 {
                        Some(s) => _mm256_sign_epi8(y, s),
                        None => y,
                    };
                    let dd = _mm256_set1_ps(d[i] * da);
                    acc[i][r] =
                        _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(lanes_avx2(x[i].0, y)), acc[i][r]);
                    if minimums {
                        extra[i][r] = m[i].mul_add(*a[r].s.get_unchecked(b), extra[i][r]);
                    }
                }
            }
        }
        let mut out = [[0f32; N]; M];
        for i in 0..M {
            for r in 0..N {
                out[i][r] = hsum_m256(acc[i][r]) + extra[i][r];
            }
        }
        out
    }
}

/// 32 values less 16 from their fifth bits at `qh` (a little-endian u32) and sixteen bytes
/// of their low nibbles at `qs` (Q5_0's), as signed bytes: a value whose fifth bit is
/// clear gets 0xF0 (its nibble less 16), one whose bit is set is its nibble.
///
/// # Safety
/// The CPU must have AVX2; `qh` points at 4 readable bytes, `qs` at 16.
#[inline(always)]
pub unsafe fn five_bits_less_16(qh: *const u8, qs: *const u8) -> __m256i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let qh = (qh as *const u32).read_unaligned();
        let high = _mm256_andnot_si256(bit_bytes(u32::from_le(qh)), _mm256_set1_epi8(0xF0u8 as i8));
        _mm256_or_si256(nibbles(qs), high)
    }
}

/// 32 signed bytes at `p` (Q8_0's).
///
/// # Safety
/// The CPU must have AVX2; `p` points at 32 readable bytes.
#[inline(always)]
pub unsafe fn bytes(p: *const u8) -> __m256i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// Products of weight rows `first` and `first + 1` of one group with a tile's activation
/// rows (`out[i][k]`, rows past the tile zero), for prompts, with AVX-512 VNNI.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 (F, VL, VNNI) must be available ([`crate::simd::vnni`]);
/// `group` holds `tile.blocks()` columns and `first + 2 <= GROUP`.
pub unsafe fn dot_pair_tile<F: Packed>(
    group: &[u8],
    first: usize,
    tile: &ActTile,
) -> [[f32; TILE_ROWS]; 2] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        assert!(group.len() >= tile.blocks() * GROUP * block_bytes::<F>() && first + 2 <= GROUP);
        macro_rules! pairs {
        ($($p:literal)*) => {
            match tile.pairs() {
                $($p => tile_vnni::<$p, F>(group, first, tile),)*
                _ => unreachable!("a tile holds one to eight pairs"),
            }
        };
    }
        pairs!(1 2 3 4 5 6 7 8)
    }
}

/// [`dot_pair_tile`] for format `F` and a tile of `P` pairs of activation rows, in
/// 512-bit vectors: each weight row's 32 values broadcast to both halves against a pair's
/// values (one row in each half), so each instruction does two (weight row, activation
/// row) pairs' eight lanes. The activations come as unsigned bytes `y + 128` and every
/// lane starts from `-128 · Σ x` of its four weights, which gives the exact `Σ x·y` for
/// signed and unsigned (Q4_1) weights alike. The tile's lines are the instructions'
/// memory operands: per block and weight row, one decoding of the values, then per pair
/// one multiply-add of integers, one product of scales, one conversion and one fused
/// multiply-add; Q4_1's minimum terms take one fused multiply-add per weight row for all
/// the tile's rows (one lane each).
///
/// # Safety
/// As for [`dot_pair_tile`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl")]
unsafe fn tile_vnni<const P: usize, F: Packed>(
    group: &[u8],
    first: usize,
    tile: &ActTile,
) -> [[f32; TILE_ROWS]; 2] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        assert!(P == tile.pairs() && 2 * P <= TILE_ROWS);
        let minimums = !F::SIGNED;
        let stride = GROUP * block_bytes::<F>();
        let per_block = 2 * P + 1;
        let lines = tile.lines();
        assert!(lines.len() >= tile.blocks() * per_block);
        let mut acc = [[_mm512_setzero_ps(); 2]; P];
        // Q4_1's Σ m·s, one lane per activation row.
        let mut extra = [_mm512_setzero_ps(); 2];
        for b in 0..tile.blocks() {
            let column = group.as_ptr().add(b * stride);
            let line = |k: usize| lines.as_ptr().add(b * per_block + k);
            let x: [__m512i; 2] = std::array::from_fn(|i| {
                _mm512_broadcast_i64x4(F::column_values(column, first + i))
            });
            let start = x.map(|x| vnni_start(true, x));
            let d: [__m512; 2] =
                std::array::from_fn(|i| _mm512_set1_ps(f16_at_ptr(column.add((first + i) * 2))));
            if minimums {
                let s = _mm512_load_ps(line(2 * P) as *const f32);
                for (i, extra) in extra.iter_mut().enumerate() {
                    let m = _mm512_set1_ps(f16_at_ptr(column.add(GROUP * 2 + (first + i) * 2)));
                    *extra = _mm512_fmadd_ps(m, s, *extra);
                }
            }
            for (p, acc) in acc.iter_mut().enumerate() {
                let y = _mm512_load_si512(line(2 * p) as *const __m512i);
                let da = _mm512_load_ps(line(2 * p + 1) as *const f32);
                for i in 0..2 {
                    let lanes = _mm512_dpbusd_epi32(start[i], y, x[i]);
                    let scale = _mm512_mul_ps(d[i], da);
                    acc[i] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(lanes), acc[i]);
                }
            }
        }
        let mut out = [[0f32; TILE_ROWS]; 2];
        for i in 0..2 {
            let mut minimum = [0f32; TILE_ROWS];
            _mm512_storeu_ps(minimum.as_mut_ptr(), extra[i]);
            for p in (0..P).step_by(2) {
                let next = if p + 1 < P {
                    acc[p + 1][i]
                } else {
                    _mm512_setzero_ps()
                };
                for (k, sum) in hsum_quads(acc[p][i], next).into_iter().enumerate() {
                    let row = 2 * p + k;
                    if row < tile.rows() {
                        out[i][row] = sum + minimum[row];
                    }
                }
            }
        }
        out
    }
}

/// The `hsum_float_8` sums of the four eight-lane halves of `a` and `b` (`a`'s low and
/// high, then `b`'s), computed side by side: each half's lanes `i` and `i + 4` added,
/// then those four sums as `(r0 + r2) + (r1 + r3)`.
///
/// # Safety
/// The CPU must have AVX-512F: register work only.
#[inline(always)]
unsafe fn hsum_quads(a: __m512, b: __m512) -> [f32; 4] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        // Per 128-bit chunk k: the first four lanes of half k, and its last four.
        let first = _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b);
        let last = _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b);
        let r = _mm512_add_ps(first, last);
        let r = _mm512_add_ps(r, _mm512_permute_ps::<0b00_00_11_10>(r));
        let r = _mm512_add_ps(r, _mm512_permute_ps::<0b00_00_00_01>(r));
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), r);
        [lanes[0], lanes[4], lanes[8], lanes[12]]
    }
}

/// [`dot_group`] with AVX-512 VNNI for format `F`, in 512-bit vectors: two weight rows
/// per vector (one in each half) against an activation row's block broadcast to both,
/// so each instruction serves two (weight row, activation row) pairs' eight lanes, with
/// the lanes' steps of [`group_avx2`]. Signed formats use the activations as `y + 128`
/// from a start of `-128 · Σ x` ([`vnni_start`]).
///
/// # Safety
/// As for [`dot_group`], and AVX-512 (F, VL, VNNI) besides.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl")]
unsafe fn group_vnni<const N: usize, const R: usize, F: Packed>(
    group: &[u8],
    blocks: usize,
    first: usize,
    a: [&Q8Row; N],
) -> [[f32; N]; R] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let ahead = crate::simd::cpu::prefetch_ahead();
        assert!(R.is_multiple_of(2) && R <= GROUP && N <= 4);
        let signed = F::SIGNED;
        let stride = GROUP * block_bytes::<F>();
        let flip = _mm512_set1_epi8(-128);
        let mut acc = [[_mm512_setzero_ps(); N]; GROUP / 2];
        // Q4_1's Σ m·s, one lane per weight row.
        let mut extra = [_mm256_setzero_ps(); N];
        // Lane indices picking rows `first + 2k` and `first + 2k + 1` of eight, eight each.
        let pick: [__m512i; GROUP / 2] = std::array::from_fn(|k| {
            let lo = _mm256_set1_epi32((first + 2 * k).min(GROUP - 1) as i32);
            let hi = _mm256_set1_epi32((first + 2 * k + 1).min(GROUP - 1) as i32);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        });
        for b in 0..blocks {
            let column = group.as_ptr().add(b * stride);
            prefetch_span(column, stride, ahead);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(column as *const __m128i));
            // Q4_1's eight minimums (unused otherwise).
            let m = if signed {
                _mm256_setzero_ps()
            } else {
                _mm256_cvtph_ps(_mm_loadu_si128(column.add(GROUP * 2) as *const __m128i))
            };
            let mut dd = [_mm512_setzero_ps(); N];
            let mut y = [_mm512_setzero_si512(); N];
            for r in 0..N {
                let da = _mm256_set1_ps(*a[r].d.get_unchecked(b));
                dd[r] = _mm512_castps256_ps512(_mm256_mul_ps(d, da));
                let q = _mm256_loadu_si256(a[r].qs.as_ptr().add(b * 32) as *const __m256i);
                let q = _mm512_broadcast_i64x4(q);
                y[r] = if signed { _mm512_xor_si512(q, flip) } else { q };
                if !signed {
                    let s = _mm256_set1_ps(*a[r].s.get_unchecked(b));
                    extra[r] = _mm256_fmadd_ps(m, s, extra[r]);
                }
            }
            for k in 0..R / 2 {
                let v = |i| F::column_values(column, first + 2 * k + i);
                let x = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(v(0)), v(1));
                let start = vnni_start(signed, x);
                for r in 0..N {
                    let lanes = vnni_lanes(signed, start, y[r], x);
                    let scale = _mm512_permutexvar_ps(pick[k], dd[r]);
                    acc[k][r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(lanes), acc[k][r]);
                }
            }
        }
        let mut out = [[0f32; N]; R];
        for r in 0..N {
            let mut minimum = [0f32; GROUP];
            _mm256_storeu_ps(minimum.as_mut_ptr(), extra[r]);
            for k in 0..R / 2 {
                let (low, high) = hsum_halves(acc[k][r]);
                out[2 * k][r] = low + minimum[first + 2 * k];
                out[2 * k + 1][r] = high + minimum[first + 2 * k + 1];
            }
        }
        out
    }
}

/// Where a weight vector's lanes start: `-128 · Σ x` of each lane's four signed values
/// (the activations go in as `y + 128`), zero for Q4_1.
///
/// # Safety
/// The CPU must have AVX-512 (F, VL, VNNI): register work only.
#[inline(always)]
unsafe fn vnni_start(signed: bool, x: __m512i) -> __m512i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let zero = _mm512_setzero_si512();
        if signed {
            _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(-128), x))
        } else {
            zero
        }
    }
}

/// `start` plus each lane's four products of weights `x` and activations `y` (taken as
/// `y + 128` for a signed format, so that the unsigned operand is the activations).
///
/// # Safety
/// The CPU must have AVX-512 (F, VL, VNNI): register work only.
#[inline(always)]
unsafe fn vnni_lanes(signed: bool, start: __m512i, y: __m512i, x: __m512i) -> __m512i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        if signed {
            _mm512_dpbusd_epi32(start, y, x)
        } else {
            _mm512_dpbusd_epi32(start, x, y)
        }
    }
}

/// The `hsum_float_8` sums of a 512-bit vector's two halves (low, high).
///
/// # Safety
/// The CPU must have AVX-512F: register work only.
#[inline(always)]
unsafe fn hsum_halves(v: __m512) -> (f32, f32) {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let upper = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        (hsum_m256(_mm512_castps512_ps256(v)), hsum_m256(upper))
    }
}
