//! AVX2 versions of the Q5_K and IQ4_XS dot products (IQ4_XS has K-quant super-blocks), for
//! CPUs without AVX-512 VNNI. Q4_K and Q6_K take their interleaved layouts' AVX2 kernels
//! there instead (`q4k_lanes::avx2`, `q6k_lanes::avx2`). Their integer sums are exact and
//! their floating-point steps are those of the portable code, so results are bit-identical.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::dot::hsum8;
use super::iq4::{self, IQ4_XS};
use super::kquant::{scale_min_k4, Q8KRow, Q5_K, QK_K};
use super::simd::{f16_at, prefetch_span};

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
    use crate::quant::{OwnFormat, RowKernel};

    /// Every row count and kernel against the portable dot products, bit for bit, on random
    /// weights and activations.
    fn check<const N: usize>(rng: &mut Xorshift, all_gemm: bool) {
        let cols = 3 * QK_K;
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
        let got5 = unsafe { dot_q5k_rows::<N, false>(&w5, a) };
        let got_xs = unsafe { dot_iq4xs_rows::<N, false>(&w_xs, a) };
        let tiled5 = unsafe { dot_q5k_rows::<N, true>(&w5, a) };
        let tiled_xs = unsafe { dot_iq4xs_rows::<N, true>(&w_xs, a) };
        for r in 0..N {
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
