//! AVX-512 twins of `float.rs`'s F32 and F16 products, each output's operations and their
//! order exactly those of the portable code (so bit-identical to it):
//! - batched rows (llama.cpp's tinyBLAS): one sixteen-lane chain of fused multiply-adds per
//!   output, here a tile of [`TILE_W`] weight rows by up to [`TILE_X`] activation rows at a
//!   time, every chain in its own register, so that each weight vector is widened once
//!   and each activation vector loaded once per tile;
//! - a lone row (ggml's vector dot product): four accumulators over blocks of 64 values,
//!   added pairwise.
//!
//! The sixteen lanes are then summed by the portable `reduce_add_16`.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use half::f16;

use crate::model::attention::reduce_add_16;

/// Weight rows per tile.
pub const TILE_W: usize = 4;
/// Most activation rows per tile (with [`TILE_W`], 24 accumulators of AVX-512's 32
/// registers).
pub const TILE_X: usize = 6;

/// A weight type the kernels widen to f32, sixteen values at a time.
pub trait Widen: Copy {
    /// Sixteen values from `p`, as f32.
    ///
    /// # Safety
    /// AVX-512F and F16C must be available and `p` must point to sixteen values.
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Widen for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        _mm512_loadu_ps(p)
    }
}

impl Widen for f16 {
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
}

fn lanes(v: __m512) -> [f32; 16] {
    // SAFETY: a plain reinterpretation of sixteen f32 lanes.
    unsafe { std::mem::transmute::<__m512, [f32; 16]>(v) }
}

/// The batched (tinyBLAS) products of `TILE_W` weight rows with `C` activation rows:
/// `out[c][r]` is `w[r] · x[c]`.
///
/// # Safety
/// AVX-512F, FMA and F16C must be available; every row holds the same number of values,
/// a multiple of sixteen.
#[target_feature(enable = "avx512f,fma,f16c")]
pub unsafe fn tile<W: Widen, const C: usize>(
    w: [&[W]; TILE_W],
    x: [&[f32]; C],
) -> [[f32; TILE_W]; C] {
    let cols = w[0].len();
    assert!(cols.is_multiple_of(16));
    assert!(w.iter().all(|w| w.len() == cols) && x.iter().all(|x| x.len() == cols));
    let mut acc = [[_mm512_setzero_ps(); TILE_W]; C];
    for k in (0..cols).step_by(16) {
        let wv: [__m512; TILE_W] = std::array::from_fn(|r| W::load16(w[r].as_ptr().add(k)));
        for c in 0..C {
            let xv = _mm512_loadu_ps(x[c].as_ptr().add(k));
            for r in 0..TILE_W {
                acc[c][r] = _mm512_fmadd_ps(wv[r], xv, acc[c][r]);
            }
        }
    }
    acc.map(|row| row.map(|a| reduce_add_16(&lanes(a))))
}

/// The lone-row products `w[r] · x` (ggml's vector dot product), each as the portable
/// `dot`: four accumulators over blocks of 64 values, added pairwise. `R` weight rows go
/// together so that each activation vector is loaded once for all and several weight
/// streams are in flight.
///
/// # Safety
/// AVX-512F, FMA and F16C must be available; every row of `w` has the length of `x`.
#[target_feature(enable = "avx512f,fma,f16c")]
pub unsafe fn lone<W: Widen + Into<f32>, const R: usize>(w: [&[W]; R], x: &[f32]) -> [f32; R] {
    assert!(w.iter().all(|w| w.len() == x.len()));
    let whole = x.len() / 64 * 64;
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    for k in (0..whole).step_by(64) {
        for i in 0..4 {
            let at = k + 16 * i;
            let xv = _mm512_loadu_ps(x.as_ptr().add(at));
            for (acc, w) in acc.iter_mut().zip(&w) {
                acc[i] = _mm512_fmadd_ps(W::load16(w.as_ptr().add(at)), xv, acc[i]);
            }
        }
    }
    std::array::from_fn(|r| {
        let acc = &acc[r];
        let first = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
        let mut sum = reduce_add_16(&lanes(first)) as f64;
        for (&w, &x) in w[r][whole..].iter().zip(&x[whole..]) {
            sum += (w.into() * x) as f64;
        }
        sum as f32
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::float;
    use crate::quant::sample::Xorshift;

    fn check<W: Widen + Into<f32>, const C: usize>(
        w: &[Vec<W>],
        x: &[Vec<f32>],
        portable: fn(&[W], &[f32], bool) -> f32,
    ) {
        // SAFETY: the caller checked the CPU.
        let got = unsafe {
            tile::<W, C>(
                std::array::from_fn(|r| &w[r][..]),
                std::array::from_fn(|c| &x[c][..]),
            )
        };
        for c in 0..C {
            for r in 0..TILE_W {
                let want = portable(&w[r], &x[c], true);
                assert_eq!(want.to_bits(), got[c][r].to_bits(), "batched {C}: {r}, {c}");
                let one = unsafe { lone::<W, 1>([&w[r]], &x[c]) };
                assert_eq!(portable(&w[r], &x[c], false).to_bits(), one[0].to_bits());
            }
            // SAFETY: as above.
            let four = unsafe { lone::<W, TILE_W>(std::array::from_fn(|r| &w[r][..]), &x[c]) };
            for (r, got) in four.iter().enumerate() {
                let want = portable(&w[r], &x[c], false);
                assert_eq!(want.to_bits(), got.to_bits(), "lone rows: {r}, {c}");
            }
        }
    }

    /// Tiles of every width and lone rows (with values past the last block of 64) equal
    /// the portable products bit for bit, for F32 and F16 weights.
    #[test]
    fn float_kernels_are_bit_identical_to_the_portable_ones() {
        let cpu = crate::cpu::detected();
        if !cpu.avx512 {
            eprintln!("skipped: this CPU lacks avx512");
            return;
        }
        let mut rng = Xorshift::new(5);
        // 13 blocks of 16: past the last block of 64 too.
        let cols = 16 * 13;
        let w32: Vec<Vec<f32>> = (0..TILE_W)
            .map(|_| (0..cols).map(|_| rng.next_f32()).collect())
            .collect();
        let w16: Vec<Vec<f16>> = w32
            .iter()
            .map(|r| r.iter().map(|&v| f16::from_f32(v)).collect())
            .collect();
        let x: Vec<Vec<f32>> = (0..TILE_X)
            .map(|_| {
                float::round_to_f16(&(0..cols).map(|_| rng.next_f32() * 3.0).collect::<Vec<_>>())
            })
            .collect();
        check::<f32, 1>(&w32, &x, float::dot_f32);
        check::<f32, 6>(&w32, &x, float::dot_f32);
        check::<f16, 1>(&w16, &x, float::dot_f16);
        check::<f16, 2>(&w16, &x, float::dot_f16);
        check::<f16, 3>(&w16, &x, float::dot_f16);
        check::<f16, 4>(&w16, &x, float::dot_f16);
        check::<f16, 5>(&w16, &x, float::dot_f16);
        check::<f16, 6>(&w16, &x, float::dot_f16);
    }
}
