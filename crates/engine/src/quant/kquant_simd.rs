//! AVX2 versions of the K-quant dot products (and IQ4_XS's, which has their super-blocks). Their integer sums are exact and their
//! floating-point steps are those of the portable code, so results are bit-identical.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::dot::hsum8;
use super::iq4::{self, IQ4_XS};
use super::kquant::{scale_min_k4, Q4kSums, Q8KRow, Q4_K, Q5_K, Q6_K, QK_K};
use super::simd::{f16_at, prefetch_span};
use super::RowKernel;

/// Q4_K · Q8_K for one weight row and `N` activation rows, each rounded as its kernel
/// says: every super-block's nibbles and scales are decoded once for all rows. (Where
/// the CPU has AVX-512 VNNI, matrices use the interleaved layout of `q4k_lanes` instead.)
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` holds whole super-blocks and every row of `a`
/// as many.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4k_rows<const N: usize>(
    w: &[u8],
    a: [&Q8KRow; N],
    kernels: [RowKernel; N],
) -> [f32; N] {
    q4k_body(w, a, kernels)
}

/// One Q4_K super-block decoded for the SIMD kernels: per sub-block its nibbles and its
/// scale broadcast to 16-bit lanes, the eight minimums, and `d`, `dmin`.
struct Q4kBlock {
    x: [__m256i; 8],
    sc: [__m256i; 8],
    mins: __m256i,
    d: f32,
    dmin: f32,
}

/// Decodes the super-block at `block`.
#[inline(always)]
unsafe fn decode_q4k(block: *const u8) -> Q4kBlock {
    let low = _mm256_set1_epi8(0x0F);
    let scales = std::slice::from_raw_parts(block.add(4), 12);
    let mut x = [_mm256_setzero_si256(); 8];
    let mut sc = [_mm256_setzero_si256(); 8];
    let mut mins = [0i32; 8];
    for pair in 0..4 {
        let bytes = _mm256_loadu_si256(block.add(16 + pair * 32) as *const __m256i);
        x[2 * pair] = _mm256_and_si256(bytes, low);
        x[2 * pair + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), low);
    }
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, scales);
        sc[j] = _mm256_set1_epi16(s as i16);
        mins[j] = m;
    }
    Q4kBlock {
        x,
        sc,
        mins: _mm256_loadu_si256(mins.as_ptr() as *const __m256i),
        d: f16_at(block),
        dmin: f16_at(block.add(2)),
    }
}

/// One activation row's exact integer sums against super-block `b`, per pair of
/// sub-blocks: `Σ scale · (nibbles · activations)` as four lanes, and in lanes 0, 1, 4
/// and 5 of the second vector `Σ minimum · (sum of the sub-block's activations)`.
#[inline(always)]
unsafe fn q4k_pair_sums(w: &Q4kBlock, a: &Q8KRow, b: usize) -> (__m128i, __m256i) {
    let q8 = a.qs.as_ptr().add(b * QK_K);
    let mut pairs = [_mm256_setzero_si256(); 4];
    for (pair, lanes) in pairs.iter_mut().enumerate() {
        for j in [2 * pair, 2 * pair + 1] {
            let y = _mm256_loadu_si256(q8.add(j * 32) as *const __m256i);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w.x[j], y), w.sc[j]);
            *lanes = _mm256_add_epi32(*lanes, p);
        }
    }
    let t = _mm256_hadd_epi32(
        _mm256_hadd_epi32(pairs[0], pairs[1]),
        _mm256_hadd_epi32(pairs[2], pairs[3]),
    );
    let psum = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
    let bsums = a.bsums.as_ptr().add(b * 16) as *const __m256i;
    let sub = _mm256_hadd_epi32(_mm256_loadu_si256(bsums), _mm256_loadu_si256(bsums.add(1)));
    let sub = _mm256_permute4x64_epi64::<0b11_01_10_00>(sub);
    let m = _mm256_mullo_epi32(w.mins, sub);
    (psum, _mm256_hadd_epi32(m, m))
}

// Always inlined into a function that enables AVX2, FMA and F16C.
#[inline(always)]
unsafe fn q4k_body<const N: usize>(w: &[u8], a: [&Q8KRow; N], kernels: [RowKernel; N]) -> [f32; N] {
    let ahead = crate::cpu::prefetch_ahead();
    let blocks = w.len() / Q4_K;
    assert!(a.iter().all(|row| row.has_blocks(blocks)));
    let mut sums = kernels.map(Q4kSums::new);
    for b in 0..blocks {
        prefetch_span(w.as_ptr().add(b * Q4_K), Q4_K, ahead);
        let block = decode_q4k(w.as_ptr().add(b * Q4_K));
        for r in 0..N {
            let (psum, m) = q4k_pair_sums(&block, a[r], b);
            let mut psum_lanes = [0i32; 4];
            _mm_storeu_si128(psum_lanes.as_mut_ptr() as *mut __m128i, psum);
            let pmin = [
                _mm256_extract_epi32::<0>(m),
                _mm256_extract_epi32::<1>(m),
                _mm256_extract_epi32::<4>(m),
                _mm256_extract_epi32::<5>(m),
            ];
            let da = *a[r].d.get_unchecked(b);
            let (dd, dm) = (block.d * da, block.dmin * da);
            for pair in 0..4 {
                sums[r].pair(psum_lanes[pair], pmin[pair], dd, dm);
            }
            sums[r].end_block(dd, dm);
        }
    }
    sums.map(|s| s.result())
}

/// Q6_K · Q8_K for one weight row and `N` activation rows: every super-block's 6-bit
/// values and scales are decoded once for all rows, each row accumulating as
/// the portable [`super::kquant::dot_q6k_portable`] does.
///
/// With `TILED` it returns the tiled matmul's arithmetic instead (`dot_*_tiled` in the
/// portable modules): the lanes' exact total per super-block, one product by `d`, one fused
/// multiply-add by the activation's scale.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` holds whole super-blocks and every row of `a`
/// as many.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q6k_rows<const N: usize, const TILED: bool>(
    w: &[u8],
    a: [&Q8KRow; N],
) -> [f32; N] {
    q6k_body::<N, TILED>(w, a)
}

// Always inlined into a function that enables AVX2, FMA and F16C.
#[inline(always)]
unsafe fn q6k_body<const N: usize, const TILED: bool>(w: &[u8], a: [&Q8KRow; N]) -> [f32; N] {
    let ahead = crate::cpu::prefetch_ahead();
    let blocks = w.len() / Q6_K;
    assert!(a.iter().all(|row| row.has_blocks(blocks)));
    let m3 = _mm256_set1_epi8(3);
    let m15 = _mm256_set1_epi8(15);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut tiled = [0f32; N];
    for b in 0..blocks {
        let block = w.as_ptr().add(b * Q6_K);
        prefetch_span(block, Q6_K, ahead);
        let (ql, qh, sc) = (block, block.add(128), block.add(192) as *const i8);
        let dw = f16_at(block.add(208));
        let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc as *const __m128i));
        // The 256 values as unsigned 6-bit bytes (32 per vector), and each vector's two
        // 16-value scales.
        let mut u = [_mm256_setzero_si256(); 8];
        let mut scale = [_mm256_setzero_si256(); 8];
        for j in 0..2 {
            let bits1 = _mm256_loadu_si256(ql.add(64 * j) as *const __m256i);
            let bits2 = _mm256_loadu_si256(ql.add(64 * j + 32) as *const __m256i);
            let high = _mm256_loadu_si256(qh.add(32 * j) as *const __m256i);
            u[4 * j] = _mm256_or_si256(
                _mm256_and_si256(bits1, m15),
                _mm256_slli_epi16::<4>(_mm256_and_si256(high, m3)),
            );
            u[4 * j + 1] = _mm256_or_si256(
                _mm256_and_si256(bits2, m15),
                _mm256_slli_epi16::<2>(_mm256_and_si256(high, _mm256_set1_epi8(12))),
            );
            u[4 * j + 2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(bits1), m15),
                _mm256_and_si256(high, _mm256_set1_epi8(48)),
            );
            u[4 * j + 3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(bits2), m15),
                _mm256_srli_epi16::<2>(_mm256_and_si256(high, _mm256_set1_epi8(-64))),
            );
            for v in 0..4 {
                let s0 = *sc.add(8 * j + 2 * v) as i16;
                let s1 = *sc.add(8 * j + 2 * v + 1) as i16;
                scale[4 * j + v] = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
            }
        }
        for r in 0..N {
            let q8 = a[r].qs.as_ptr().add(b * QK_K);
            let d = *a[r].d.get_unchecked(b) * dw;
            // bsums are i32 here; pack them to i16 in order for the multiply-add.
            let bsums = a[r].bsums.as_ptr().add(b * 16) as *const __m256i;
            let bsums16 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(
                _mm256_loadu_si256(bsums),
                _mm256_loadu_si256(bsums.add(1)),
            ));
            // The values are stored +32: subtract 32 · Σ scale · (sum of 16 activations).
            let correction = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums16, scales));
            let mut lanes = _mm256_setzero_si256();
            for k in 0..8 {
                let y = _mm256_loadu_si256(q8.add(32 * k) as *const __m256i);
                lanes = _mm256_add_epi32(
                    lanes,
                    _mm256_madd_epi16(scale[k], _mm256_maddubs_epi16(u[k], y)),
                );
            }
            lanes = _mm256_sub_epi32(lanes, correction);
            if TILED {
                let result = lane_sum(lanes) as f32 * dw;
                tiled[r] = result.mul_add(*a[r].d.get_unchecked(b), tiled[r]);
                continue;
            }
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc[r]);
        }
    }
    if TILED {
        return tiled;
    }
    acc.map(|acc| {
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), acc);
        hsum8(&out)
    })
}

/// Q5_K · Q8_K for one weight row and `N` activation rows, as
/// [`super::kquant::dot_q5k_portable`]: every super-block's 5-bit values and scales are
/// decoded once for all rows, then per row and sub-block one `maddubs` and one `madd` by
/// the scale give the eight integer lanes. (Where the CPU has AVX-512 VNNI, matrices use
/// the two-row layout of `pair_lanes` instead.)
///
/// With `TILED` it returns the tiled matmul's arithmetic instead (`dot_*_tiled` in the
/// portable modules): the lanes' exact total per super-block, one product by `d`, one fused
/// multiply-add by the activation's scale.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` holds whole super-blocks and every row of `a`
/// as many.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5k_rows<const N: usize, const TILED: bool>(
    w: &[u8],
    a: [&Q8KRow; N],
) -> [f32; N] {
    let ahead = crate::cpu::prefetch_ahead();
    let blocks = w.len() / Q5_K;
    assert!(a.iter().all(|row| row.has_blocks(blocks)));
    let low = _mm256_set1_epi8(0x0F);
    let bit4 = _mm256_set1_epi8(0x10);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_min = [0f32; N];
    for b in 0..blocks {
        let block = w.as_ptr().add(b * Q5_K);
        prefetch_span(block, Q5_K, ahead);
        let scales = std::slice::from_raw_parts(block.add(4), 12);
        let qh = _mm256_loadu_si256(block.add(16) as *const __m256i);
        let mut x = [_mm256_setzero_si256(); 8];
        let mut sc = [_mm256_setzero_si256(); 8];
        let mut mins = [0i32; 8];
        for (j, x) in x.iter_mut().enumerate() {
            let bytes = _mm256_loadu_si256(block.add(48 + 32 * (j / 2)) as *const __m256i);
            let nibbles = match j % 2 {
                0 => _mm256_and_si256(bytes, low),
                _ => _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), low),
            };
            // Bit j of each qh byte moved to bit 4 (within the byte for shifts up to four).
            let high = match j <= 4 {
                true => _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - j as i32)),
                false => _mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32 - 4)),
            };
            *x = _mm256_or_si256(nibbles, _mm256_and_si256(high, bit4));
            let (s, m) = scale_min_k4(j, scales);
            sc[j] = _mm256_set1_epi16(s as i16);
            mins[j] = m;
        }
        let (dw, dminw) = (f16_at(block), f16_at(block.add(2)));
        for r in 0..N {
            let q8 = a[r].qs.as_ptr().add(b * QK_K);
            let bsums = &a[r].bsums[b * 16..b * 16 + 16];
            let mut lanes = _mm256_setzero_si256();
            let mut imin = 0i32;
            for j in 0..8 {
                let y = _mm256_loadu_si256(q8.add(32 * j) as *const __m256i);
                let products = _mm256_maddubs_epi16(x[j], y);
                lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(sc[j], products));
                imin += mins[j] * (bsums[2 * j] + bsums[2 * j + 1]);
            }
            let da = *a[r].d.get_unchecked(b);
            if TILED {
                let result = (-dminw).mul_add(imin as f32, lane_sum(lanes) as f32 * dw);
                acc_min[r] = result.mul_add(da, acc_min[r]);
                continue;
            }
            acc_min[r] = (imin as f32).mul_add(-da * dminw, acc_min[r]);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(da * dw), _mm256_cvtepi32_ps(lanes), acc[r]);
        }
    }
    std::array::from_fn(|r| {
        if TILED {
            return acc_min[r];
        }
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), acc[r]);
        hsum8(&out) + acc_min[r]
    })
}

/// The exact (wrapping) sum of eight integer lanes.
///
/// # Safety
/// AVX must be available (inlined into functions that enable AVX2).
#[inline(always)]
unsafe fn lane_sum(lanes: __m256i) -> i32 {
    let mut all = [0i32; 8];
    _mm256_storeu_si256(all.as_mut_ptr() as *mut __m256i, lanes);
    all.iter().fold(0i32, |s, &v| s.wrapping_add(v))
}

/// IQ4_XS · Q8_K for one weight row and `N` activation rows, as
/// [`super::iq4::dot_iq4_xs`]: every super-block's table values are looked up once for all
/// rows, then per row and sub-block a signed `maddubs` (the values' magnitudes by the
/// activations with the values' signs) and one `madd` by the scale give the eight lanes.
///
/// With `TILED` it returns the tiled matmul's arithmetic instead (`dot_*_tiled` in the
/// portable modules): the lanes' exact total per super-block, one product by `d`, one fused
/// multiply-add by the activation's scale.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` holds whole super-blocks and every row of `a`
/// as many.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_iq4xs_rows<const N: usize, const TILED: bool>(
    w: &[u8],
    a: [&Q8KRow; N],
) -> [f32; N] {
    let ahead = crate::cpu::prefetch_ahead();
    let blocks = w.len() / IQ4_XS;
    assert!(a.iter().all(|row| row.has_blocks(blocks)));
    let table = _mm_loadu_si128(iq4::VALUES.as_ptr() as *const __m128i);
    let table = _mm256_broadcastsi128_si256(table);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut tiled = [0f32; N];
    for b in 0..blocks {
        let block = w.as_ptr().add(b * IQ4_XS);
        prefetch_span(block, IQ4_XS, ahead);
        let raw = std::slice::from_raw_parts(block, IQ4_XS);
        let mut x = [_mm256_setzero_si256(); 8];
        let mut sc = [_mm256_setzero_si256(); 8];
        for (j, x) in x.iter_mut().enumerate() {
            *x = _mm256_shuffle_epi8(table, super::simd::nibbles(block.add(8 + 16 * j)));
            sc[j] = _mm256_set1_epi16(iq4::xs_scale(raw, j) as i16);
        }
        let dw = f16_at(block);
        for r in 0..N {
            let q8 = a[r].qs.as_ptr().add(b * QK_K);
            let mut lanes = _mm256_setzero_si256();
            for j in 0..8 {
                // Activations lie in -127..=127, so negating them never overflows and
                // a pair of products fits in 16 bits: Q8_K's scale is 127 / max, and a
                // degenerate block keeps within it too (an all-zero block is skipped;
                // an infinite maximum makes the scale zero and NaN products round to
                // 0).
                let y = _mm256_loadu_si256(q8.add(32 * j) as *const __m256i);
                let products =
                    _mm256_maddubs_epi16(_mm256_abs_epi8(x[j]), _mm256_sign_epi8(y, x[j]));
                lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(sc[j], products));
            }
            if TILED {
                let result = lane_sum(lanes) as f32 * dw;
                tiled[r] = result.mul_add(*a[r].d.get_unchecked(b), tiled[r]);
                continue;
            }
            let d = dw * *a[r].d.get_unchecked(b);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc[r]);
        }
    }
    if TILED {
        return tiled;
    }
    acc.map(|acc| {
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), acc);
        hsum8(&out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::kquant::{self, quantize_row_q8k};
    use crate::quant::sample::{self, Xorshift};
    use crate::quant::OwnFormat;

    /// Every row count and kernel against the portable dot products, bit for bit, on random
    /// weights and activations.
    fn check<const N: usize>(rng: &mut Xorshift, all_gemm: bool) {
        let cols = 3 * QK_K;
        let w4 = sample::weights(OwnFormat::Q4K, 1, cols, rng);
        let w6 = sample::weights(OwnFormat::Q6K, 1, cols, rng);
        let w5 = sample::weights(OwnFormat::Q5K, 1, cols, rng);
        let w_xs = sample::weights(OwnFormat::Iq4Xs, 1, cols, rng);
        let kernels: [RowKernel; N] = std::array::from_fn(|r| {
            if !all_gemm && (rng.next_u64().is_multiple_of(2) || r == 0) {
                RowKernel::Gemv
            } else {
                RowKernel::Gemm4
            }
        });
        let acts: Vec<Q8KRow> = kernels
            .iter()
            .map(|&k| quantize_row_q8k(&sample::activations(1, cols, 4.0, rng), k))
            .collect();
        let a: [&Q8KRow; N] = std::array::from_fn(|r| &acts[r]);
        let got4 = unsafe { dot_q4k_rows(&w4, a, kernels) };
        let got6 = unsafe { dot_q6k_rows::<N, false>(&w6, a) };
        let tiled6 = unsafe { dot_q6k_rows::<N, true>(&w6, a) };
        let got5 = unsafe { dot_q5k_rows::<N, false>(&w5, a) };
        let got_xs = unsafe { dot_iq4xs_rows::<N, false>(&w_xs, a) };
        let tiled5 = unsafe { dot_q5k_rows::<N, true>(&w5, a) };
        let tiled_xs = unsafe { dot_iq4xs_rows::<N, true>(&w_xs, a) };
        for r in 0..N {
            let want4 = kquant::dot_q4k_portable(&w4, a[r], kernels[r]);
            assert_eq!(want4.to_bits(), got4[r].to_bits(), "Q4_K {N} rows, row {r}");
            let want6 = kquant::dot_q6k_portable(&w6, a[r]);
            assert_eq!(want6.to_bits(), got6[r].to_bits(), "Q6_K {N} rows, row {r}");
            let want6 = kquant::dot_q6k_tiled(&w6, a[r]);
            assert_eq!(
                want6.to_bits(),
                tiled6[r].to_bits(),
                "tiled Q6_K {N}, row {r}"
            );
            let want5 = kquant::dot_q5k_portable(&w5, a[r]);
            assert_eq!(want5.to_bits(), got5[r].to_bits(), "Q5_K {N} rows, row {r}");
            let want_xs = iq4::dot_iq4_xs(&w_xs, a[r]);
            assert_eq!(
                want_xs.to_bits(),
                got_xs[r].to_bits(),
                "IQ4_XS {N} rows, row {r}"
            );
            let want5 = kquant::dot_q5k_tiled(&w5, a[r]);
            assert_eq!(
                want5.to_bits(),
                tiled5[r].to_bits(),
                "tiled Q5_K {N}, row {r}"
            );
            let want_xs = iq4::dot_iq4_xs_tiled(&w_xs, a[r]);
            assert_eq!(
                want_xs.to_bits(),
                tiled_xs[r].to_bits(),
                "tiled IQ4_XS {N}, {r}"
            );
        }
    }

    #[test]
    fn avx2_k_quants_are_bit_identical_to_the_portable_ones() {
        // Whatever FERRITE_CPU says: this compares the kernel the CPU can run. A CPU
        // without it cannot run it; the end-to-end tests under FERRITE_CPU cover the rest.
        if crate::cpu::lacks(crate::cpu::detected().avx2, "avx2") {
            return;
        }
        let mut rng = Xorshift::new(3);
        for _ in 0..50 {
            for all_gemm in [false, true] {
                check::<1>(&mut rng, all_gemm);
                check::<2>(&mut rng, all_gemm);
                check::<3>(&mut rng, all_gemm);
                check::<4>(&mut rng, all_gemm);
            }
        }
    }
}
