//! BF16 weights' kernels on a CPU with AVX512-BF16: `vdpbf16ps` itself, the instruction
//! llama.cpp's BF16 products use on such a CPU, so the portable twin
//! ([`super::float::dot_bf16`], which spells out its rounding) and these give the same
//! bits. A lone row (decode) is llama.cpp's vector dot product (two accumulators over
//! alternate blocks of 32 values, ended in f64); batched rows (prompts) are tinyBLAS's
//! products, one accumulator per output, computed here as tiles of [`TILE_W`] weight rows
//! by up to [`TILE_X`](super::float_simd::TILE_X) activation rows so that each accumulator's chain of `vdpbf16ps`
//! overlaps with the others'.
//!
//! The activations arrive as f32 already rounded to BF16 (exactly representable), and are
//! narrowed by taking each value's upper 16 bits: exact, where the instruction's own
//! conversion would flush subnormals. Tiles take them narrowed once per product (narrowing
//! them per load took a third of the tile's speed).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use half::bf16;

use super::float_simd::lanes;
use crate::simd::prefetch::prefetch_span;
use crate::simd::reduce::reduce_add_16;

/// Values one `vdpbf16ps` takes from each operand.
const BLOCK: usize = 32;
pub use super::float_simd::TILE_W;
#[cfg(test)]
use super::float_simd::TILE_X;

/// Word indices picking the upper halves of 32 f32 lanes (two vectors), in order.
///
/// # Safety
/// AVX-512F must be available.
#[inline(always)]
unsafe fn upper_halves() -> __m512i {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let idx: [u16; 32] = std::array::from_fn(|k| 2 * k as u16 + 1);
        _mm512_loadu_si512(idx.as_ptr() as *const __m512i)
    }
}

/// 32 f32 values at `p` (each exactly a BF16) as 32 BF16s.
///
/// # Safety
/// AVX-512F and BW must be available, `idx` must be [`upper_halves`], and 32 f32 values
/// must be readable at `p`.
#[inline(always)]
unsafe fn narrow(p: *const f32, idx: __m512i) -> __m512bh {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let low = _mm512_loadu_si512(p as *const __m512i);
        let high = _mm512_loadu_si512(p.add(16) as *const __m512i);
        std::mem::transmute::<__m512i, __m512bh>(_mm512_permutex2var_epi16(low, idx, high))
    }
}

/// 32 BF16 values at `p`.
///
/// # Safety
/// AVX-512F must be available and 32 BF16 values readable at `p`.
#[inline(always)]
unsafe fn load(p: *const bf16) -> __m512bh {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p as *const __m512i)) }
}

/// [`super::float::dot_bf16`] of one lone (not batched) row: `w · x`, where `x` holds
/// values already rounded to BF16 ([`crate::simd::convert::round_to_bf16`]): they are narrowed by
/// dropping their lower 16 bits, so any other value would be truncated, not rounded.
///
/// # Safety
/// AVX-512F, BW and BF16 must be available ([`crate::simd::bf16`]).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub unsafe fn lone(w: &[bf16], x: &[f32]) -> f32 {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let ahead = crate::simd::cpu::prefetch_ahead();
        assert_eq!(w.len(), x.len());
        let idx = upper_halves();
        let whole = w.len() / (2 * BLOCK) * (2 * BLOCK);
        let mut acc = [_mm512_setzero_ps(); 2];
        for k in (0..whole).step_by(2 * BLOCK) {
            prefetch_span(w.as_ptr().add(k), 2 * BLOCK * 2, ahead);
            for (i, acc) in acc.iter_mut().enumerate() {
                let at = k + i * BLOCK;
                *acc = _mm512_dpbf16_ps(
                    *acc,
                    load(w.as_ptr().add(at)),
                    narrow(x.as_ptr().add(at), idx),
                );
            }
        }
        let mut sum = reduce_add_16(&lanes(acc[0])) as f64 + reduce_add_16(&lanes(acc[1])) as f64;
        for (&w, &x) in w[whole..].iter().zip(&x[whole..]) {
            sum += (w.to_f32() * x) as f64;
        }
        sum as f32
    }
}

/// The batched products of [`TILE_W`] weight rows with `C` activation rows (narrowed by
/// [`crate::simd::convert::narrow_to_bf16`]), each [`super::float::dot_bf16`] batched: `out[c][r]` is `w[r] · x[c]`.
///
/// # Safety
/// AVX-512F, BW and BF16 must be available ([`crate::simd::bf16`]); every row holds the same
/// number of values, a multiple of 32.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub unsafe fn tile<const C: usize>(w: [&[bf16]; TILE_W], x: [&[bf16]; C]) -> [[f32; TILE_W]; C] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let cols = w[0].len();
        assert!(cols.is_multiple_of(BLOCK));
        assert!(w.iter().all(|w| w.len() == cols) && x.iter().all(|x| x.len() == cols));
        let mut acc = [[_mm512_setzero_ps(); TILE_W]; C];
        for k in (0..cols).step_by(BLOCK) {
            let wv: [__m512bh; TILE_W] = std::array::from_fn(|r| load(w[r].as_ptr().add(k)));
            for c in 0..C {
                let xv = load(x[c].as_ptr().add(k));
                for r in 0..TILE_W {
                    acc[c][r] = _mm512_dpbf16_ps(acc[c][r], wv[r], xv);
                }
            }
        }
        std::array::from_fn(|c| std::array::from_fn(|r| reduce_add_16(&lanes(acc[c][r]))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::float::dot_bf16;
    use crate::quant::sample::Xorshift;
    use crate::simd::convert::{narrow_to_bf16, round_to_bf16};

    fn row(n: usize, scale: f32, rng: &mut Xorshift) -> Vec<f32> {
        (0..n).map(|_| rng.next_f32() * scale).collect()
    }

    /// Lone rows of every length class (whole blocks of 64, a block of 32 left, a
    /// ragged tail) and batched tiles of every height give the portable twin's bits.
    #[test]
    fn bf16_kernels_are_bit_identical_to_the_portable_ones() {
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().bf16, "AVX512-BF16") {
            return;
        }
        let mut rng = Xorshift::new(7);
        for cols in [64, 96, 100, 2048, 2080] {
            // The last scale makes most products subnormal (flushed to zero).
            for scale in [1.0, 3e4, 1e-20] {
                let w: Vec<bf16> = row(cols, scale, &mut rng)
                    .into_iter()
                    .map(bf16::from_f32)
                    .collect();
                let x = round_to_bf16(&row(cols, scale, &mut rng));
                // SAFETY: the CPU has AVX512-BF16 (checked above).
                let got = unsafe { lone(&w, &x) };
                assert_eq!(
                    got.to_bits(),
                    dot_bf16(&w, &x, false).to_bits(),
                    "lone, {cols} values"
                );
            }
        }
        let cols = 512;
        let w: Vec<Vec<bf16>> = (0..TILE_W)
            .map(|_| {
                row(cols, 1.0, &mut rng)
                    .into_iter()
                    .map(bf16::from_f32)
                    .collect()
            })
            .collect();
        let x: Vec<Vec<f32>> = (0..TILE_X)
            .map(|_| round_to_bf16(&row(cols, 1.0, &mut rng)))
            .collect();
        let narrowed: Vec<Vec<bf16>> = x.iter().map(|x| narrow_to_bf16(x)).collect();
        let ws: [&[bf16]; TILE_W] = std::array::from_fn(|r| w[r].as_slice());
        // Each tile height against the portable kernel.
        macro_rules! check {
            ($($c:literal)*) => {$(
                // SAFETY: as above.
                let got = unsafe { tile::<$c>(ws, std::array::from_fn(|c| narrowed[c].as_slice())) };
                for (c, got) in got.iter().enumerate() {
                    for (r, got) in got.iter().enumerate() {
                        assert_eq!(
                            got.to_bits(),
                            dot_bf16(&w[r], &x[c], true).to_bits(),
                            "tile of {}: ({c}, {r})", $c
                        );
                    }
                }
            )*};
        }
        check!(1 2 3 4 5 6);
    }
}
