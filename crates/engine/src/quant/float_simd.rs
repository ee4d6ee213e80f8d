//! AVX-512 and AVX2 twins of `float.rs`'s F32 and F16 products, each output's operations
//! and their order exactly those of the portable code (so bit-identical to it):
//! - batched rows (llama.cpp's tinyBLAS): one sixteen-lane chain of fused multiply-adds per
//!   output, here a tile of [`TILE_W`] weight rows by up to [`TILE_X`] activation rows at a
//!   time, every chain in its own register, so that each weight vector is widened once
//!   and each activation vector loaded once per tile;
//! - a lone row (ggml's vector dot product): four accumulators over blocks of 64 values,
//!   added pairwise.
//!
//! The sixteen lanes are then summed in `reduce_add_16`'s order: by `reduce_add_16` itself,
//! except an AVX-512 tile's outputs, sixteen at a time in vectors (`reduce_add_16_many`,
//! the same additions). Activations come as the weights' type (f32, or F16 for F16
//! weights) and are widened exactly as they are loaded. With AVX2 a
//! sixteen-lane chain is held as two eight-lane halves (the same operations per lane), in
//! passes of four weight rows by up to two activation rows, which fit its 16 registers: each
//! chain's low eight lanes over the row, then its high eight (a vision tower's products
//! took about an eighth less time than in two-by-two tiles that held both halves at once).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use half::f16;

use crate::simd::prefetch::prefetch_span;
use crate::simd::reduce::reduce_add_16;

/// The instruction set the kernels run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F with FMA and F16C.
    Avx512,
    /// AVX2 with FMA and F16C.
    Avx2,
}

impl Isa {
    /// The best this process may use ([`crate::simd::cpu::features`]), if any.
    pub fn detected() -> Option<Self> {
        let cpu = crate::simd::cpu::features();
        match (cpu.avx512, cpu.avx2) {
            (true, _) => Some(Self::Avx512),
            (false, true) => Some(Self::Avx2),
            _ => None,
        }
    }
}

/// Weight rows per tile.
pub const TILE_W: usize = 4;
/// Most activation rows per tile (with [`TILE_W`], 24 accumulators of AVX-512's 32
/// registers).
pub const TILE_X: usize = 6;

/// A weight or activation type the kernels widen to f32, sixteen (or eight) values at a
/// time.
pub trait Widen: Copy + Into<f32> {
    /// Sixteen values from `p`, as f32.
    ///
    /// # Safety
    /// AVX-512F and F16C must be available and `p` must point to sixteen values.
    unsafe fn load16(p: *const Self) -> __m512;
    /// Eight values from `p`, as f32.
    ///
    /// # Safety
    /// AVX and F16C must be available and `p` must point to eight values.
    unsafe fn load8(p: *const Self) -> __m256;
}

impl Widen for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl Widen for f16 {
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
}

/// [`tile_avx512`] or its AVX2 twin.
///
/// # Safety
/// `isa` must be available; as [`tile_avx512`] otherwise.
pub unsafe fn tile<W: Widen, X: Widen, const C: usize>(
    isa: Isa,
    w: [&[W]; TILE_W],
    x: [&[X]; C],
) -> [[f32; TILE_W]; C] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        match isa {
            Isa::Avx512 => tile_avx512(w, x),
            Isa::Avx2 => tile_avx2(w, x),
        }
    }
}

/// [`lone_avx512`] or its AVX2 twin.
///
/// # Safety
/// `isa` must be available; as [`lone_avx512`] otherwise.
pub unsafe fn lone<W: Widen, X: Widen, const R: usize>(
    isa: Isa,
    w: [&[W]; R],
    x: &[X],
) -> [f32; R] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        match isa {
            Isa::Avx512 => lone_avx512(w, x),
            Isa::Avx2 => std::array::from_fn(|r| lone_avx2(w[r], x)),
        }
    }
}

/// Sixteen lanes held as two halves, as one sixteen-lane sum.
fn halves_sum(low: __m256, high: __m256) -> f32 {
    // SAFETY: plain reinterpretations of eight f32 lanes.
    let (low, high) = unsafe {
        (
            std::mem::transmute::<__m256, [f32; 8]>(low),
            std::mem::transmute::<__m256, [f32; 8]>(high),
        )
    };
    let mut lanes = [0f32; 16];
    lanes[..8].copy_from_slice(&low);
    lanes[8..].copy_from_slice(&high);
    reduce_add_16(&lanes)
}

/// [`tile_avx512`] with AVX2: four weight rows by up to two activation rows at a time, one
/// eight-lane half of every chain after the other.
///
/// # Safety
///
/// The CPU has AVX2, FMA and F16C (the lengths are checked).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<W: Widen, X: Widen, const C: usize>(
    w: [&[W]; TILE_W],
    x: [&[X]; C],
) -> [[f32; TILE_W]; C] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let cols = w[0].len();
        assert!(cols.is_multiple_of(16));
        assert!(w.iter().all(|w| w.len() == cols) && x.iter().all(|x| x.len() == cols));
        // Each sixteen-lane chain as its low eight lanes' pass over the row, then its high
        // eight lanes': four weight rows by two activation rows, eight accumulators.
        let mut halves = [[[_mm256_setzero_ps(); TILE_W]; C]; 2];
        for (half, sums) in halves.iter_mut().enumerate() {
            for c0 in (0..C).step_by(2) {
                let cs = (C - c0).min(2);
                let mut acc = [[_mm256_setzero_ps(); TILE_W]; 2];
                for k in (8 * half..cols).step_by(16) {
                    let wv: [__m256; TILE_W] =
                        std::array::from_fn(|r| W::load8(w[r].as_ptr().add(k)));
                    for (c, acc) in acc.iter_mut().enumerate().take(cs) {
                        let xv = X::load8(x[c0 + c].as_ptr().add(k));
                        for (acc, wv) in acc.iter_mut().zip(&wv) {
                            *acc = _mm256_fmadd_ps(*wv, xv, *acc);
                        }
                    }
                }
                sums[c0..c0 + cs].copy_from_slice(&acc[..cs]);
            }
        }
        let mut out = [[0f32; TILE_W]; C];
        for (c, out) in out.iter_mut().enumerate() {
            for (r, out) in out.iter_mut().enumerate() {
                *out = halves_sum(halves[0][c][r], halves[1][c][r]);
            }
        }
        out
    }
}

/// [`lone_avx512`] of one row with AVX2.
///
/// # Safety
///
/// The CPU has AVX2, FMA and F16C (the lengths are checked).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lone_avx2<W: Widen, X: Widen>(w: &[W], x: &[X]) -> f32 {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let ahead = crate::simd::cpu::prefetch_ahead();
        assert_eq!(w.len(), x.len());
        let whole = x.len() / 64 * 64;
        let mut acc = [(_mm256_setzero_ps(), _mm256_setzero_ps()); 4];
        for k in (0..whole).step_by(64) {
            prefetch_span(w.as_ptr().add(k), 64 * size_of::<W>(), ahead);
            for (i, acc) in acc.iter_mut().enumerate() {
                let at = k + 16 * i;
                let (wp, xp) = (w.as_ptr().add(at), x.as_ptr().add(at));
                acc.0 = _mm256_fmadd_ps(W::load8(wp), X::load8(xp), acc.0);
                acc.1 = _mm256_fmadd_ps(W::load8(wp.add(8)), X::load8(xp.add(8)), acc.1);
            }
        }
        let pair = |a: (__m256, __m256), b: (__m256, __m256)| {
            (_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1))
        };
        let (l, r) = (pair(acc[0], acc[2]), pair(acc[1], acc[3]));
        let first = pair(l, r);
        let mut sum = halves_sum(first.0, first.1) as f64;
        for (&w, &x) in w[whole..].iter().zip(&x[whole..]) {
            sum += (w.into() * x.into()) as f64;
        }
        sum as f32
    }
}

/// The sixteen f32 lanes of `v`.
pub(super) fn lanes(v: __m512) -> [f32; 16] {
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
unsafe fn tile_avx512<W: Widen, X: Widen, const C: usize>(
    w: [&[W]; TILE_W],
    x: [&[X]; C],
) -> [[f32; TILE_W]; C] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let cols = w[0].len();
        assert!(cols.is_multiple_of(16));
        assert!(w.iter().all(|w| w.len() == cols) && x.iter().all(|x| x.len() == cols));
        let mut acc = [[_mm512_setzero_ps(); TILE_W]; C];
        for k in (0..cols).step_by(16) {
            let wv: [__m512; TILE_W] = std::array::from_fn(|r| W::load16(w[r].as_ptr().add(k)));
            for c in 0..C {
                let xv = X::load16(x[c].as_ptr().add(k));
                for r in 0..TILE_W {
                    acc[c][r] = _mm512_fmadd_ps(wv[r], xv, acc[c][r]);
                }
            }
        }
        // Up to 24 outputs, reduced sixteen at a time (the last group padded with zeros).
        let mut out = [[0f32; TILE_W]; C];
        let n = C * TILE_W;
        for start in (0..n).step_by(16) {
            let sums = reduce_add_16_many(std::array::from_fn(|i| match start + i < n {
                true => acc[(start + i) / TILE_W][(start + i) % TILE_W],
                false => _mm512_setzero_ps(),
            }));
            for (i, &sum) in sums.iter().take(n - start).enumerate() {
                out[(start + i) / TILE_W][(start + i) % TILE_W] = sum;
            }
        }
        out
    }
}

/// Sixteen vectors' `reduce_add_16`s at once, each the same additions in the same tree
/// (halves, then quarters, then pairs, then neighbours), carried out for all sixteen in
/// fifteen vector additions: level by level, shuffles line up two vectors' halves (then
/// quarters, ...) so that one addition takes a level of two (then four, ...) of them. A
/// tile's 24 horizontal sums one by one cost about as much as a tenth of its products.
///
/// # Safety
/// AVX-512F must be available.
#[inline(always)]
unsafe fn reduce_add_16_many(v: [__m512; 16]) -> [f32; 16] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        // Level 1: vector k holds v[2k]'s eight half sums in lanes 0..8, v[2k + 1]'s in 8..16.
        let halves: [__m512; 8] = std::array::from_fn(|k| {
            let (a, b) = (v[2 * k], v[2 * k + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x44>(a, b),
                _mm512_shuffle_f32x4::<0xEE>(a, b),
            )
        });
        // Level 2: 128-bit lane t of vector m holds v[4m + t]'s four quarter sums.
        let quarters: [__m512; 4] = std::array::from_fn(|m| {
            let (a, b) = (halves[2 * m], halves[2 * m + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(a, b),
                _mm512_shuffle_f32x4::<0xDD>(a, b),
            )
        });
        // Level 3: lane t of vector n holds v[8n + t]'s two pair sums, then v[8n + 4 + t]'s.
        let pairs: [__m512; 2] = std::array::from_fn(|n| {
            let (a, b) = (quarters[2 * n], quarters[2 * n + 1]);
            _mm512_add_ps(
                _mm512_shuffle_ps::<0x44>(a, b),
                _mm512_shuffle_ps::<0xEE>(a, b),
            )
        });
        // Level 4: element u of lane t holds v[4u + t]'s sum.
        let (a, b) = (pairs[0], pairs[1]);
        let sums = lanes(_mm512_add_ps(
            _mm512_shuffle_ps::<0x88>(a, b),
            _mm512_shuffle_ps::<0xDD>(a, b),
        ));
        std::array::from_fn(|i| sums[4 * (i % 4) + i / 4])
    }
}

/// The lone-row products `w[r] · x` (ggml's vector dot product), each as the portable
/// `dot`: four accumulators over blocks of 64 values, added pairwise. `R` weight rows go
/// together so that each activation vector is loaded once for all and several weight
/// streams are in flight.
///
/// # Safety
/// AVX-512F, FMA and F16C must be available; every row of `w` has the length of `x`.
#[target_feature(enable = "avx512f,fma,f16c")]
unsafe fn lone_avx512<W: Widen, X: Widen, const R: usize>(w: [&[W]; R], x: &[X]) -> [f32; R] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let ahead = crate::simd::cpu::prefetch_ahead();
        assert!(w.iter().all(|w| w.len() == x.len()));
        let whole = x.len() / 64 * 64;
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        for k in (0..whole).step_by(64) {
            for w in &w {
                prefetch_span(w.as_ptr().add(k), 64 * size_of::<W>(), ahead);
            }
            for i in 0..4 {
                let at = k + 16 * i;
                let xv = X::load16(x.as_ptr().add(at));
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
                sum += (w.into() * x.into()) as f64;
            }
            sum as f32
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::float;
    use crate::quant::sample::Xorshift;

    fn check<W: Widen, X: Widen, const C: usize>(
        isa: Isa,
        w: &[Vec<W>],
        x: &[Vec<X>],
        portable: fn(&[W], &[X], bool) -> f32,
    ) {
        // SAFETY: the caller checked the CPU.
        let got = unsafe {
            tile::<W, X, C>(
                isa,
                std::array::from_fn(|r| &w[r][..]),
                std::array::from_fn(|c| &x[c][..]),
            )
        };
        for c in 0..C {
            for r in 0..TILE_W {
                let want = portable(&w[r], &x[c], true);
                assert_eq!(want.to_bits(), got[c][r].to_bits(), "{isa:?} {C}: {r}, {c}");
            }
            // SAFETY: as above.
            let rows =
                unsafe { lone::<W, X, TILE_W>(isa, std::array::from_fn(|r| &w[r][..]), &x[c]) };
            // SAFETY: as above: the CPU has the ISA, and the rows are as wide as the activations.
            let one = unsafe { lone::<W, X, 1>(isa, [&w[1]], &x[c]) };
            for (r, got) in rows.iter().enumerate() {
                let want = portable(&w[r], &x[c], false);
                assert_eq!(want.to_bits(), got.to_bits(), "{isa:?} lone rows: {r}, {c}");
            }
            assert_eq!(rows[1].to_bits(), one[0].to_bits());
        }
    }

    /// The sixteen sums at once are `reduce_add_16`'s bit for bit, on sums that round
    /// differently in another order.
    #[test]
    fn sixteen_reductions_at_once_follow_the_scalar_tree() {
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().avx512, "AVX-512") {
            return;
        }
        let mut rng = Xorshift::new(11);
        let rows: [[f32; 16]; 16] = std::array::from_fn(|r| {
            std::array::from_fn(|l| {
                let big = if (r + l) % 3 == 0 { 1e7 } else { 1.0 };
                (rng.next_f32() - 0.5) * big
            })
        });
        // SAFETY: AVX-512 was checked; plain loads of sixteen f32.
        let got = unsafe {
            reduce_add_16_many(std::array::from_fn(|r| _mm512_loadu_ps(rows[r].as_ptr())))
        };
        for (r, row) in rows.iter().enumerate() {
            assert_eq!(got[r].to_bits(), reduce_add_16(row).to_bits(), "row {r}");
        }
        // Another order of the same additions gives another result for some row.
        let flat: Vec<f32> = rows.iter().map(|r| r.iter().sum::<f32>()).collect();
        assert!(flat
            .iter()
            .zip(&got)
            .any(|(a, b)| a.to_bits() != b.to_bits()));
    }

    /// Tiles of every width and lone rows (with values past the last block of 64) equal
    /// the portable products bit for bit, for F32 and F16 weights, on both instruction
    /// sets the CPU has.
    #[test]
    fn float_kernels_are_bit_identical_to_the_portable_ones() {
        let cpu = crate::simd::cpu::detected();
        let isas = [(Isa::Avx512, cpu.avx512), (Isa::Avx2, cpu.avx2)];
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
        let x16: Vec<Vec<f16>> = (0..TILE_X)
            .map(|_| {
                crate::simd::convert::round_to_f16(
                    &(0..cols).map(|_| rng.next_f32() * 3.0).collect::<Vec<_>>(),
                )
            })
            .collect();
        let x32: Vec<Vec<f32>> = (0..TILE_X)
            .map(|_| (0..cols).map(|_| rng.next_f32() * 3.0).collect())
            .collect();
        for (isa, available) in isas {
            if crate::simd::cpu::lacks(available, &format!("{isa:?}")) {
                continue;
            }
            check::<f32, f32, 1>(isa, &w32, &x32, float::dot_f32);
            check::<f32, f32, 6>(isa, &w32, &x32, float::dot_f32);
            check::<f16, f16, 1>(isa, &w16, &x16, float::dot_f16);
            check::<f16, f16, 2>(isa, &w16, &x16, float::dot_f16);
            check::<f16, f16, 3>(isa, &w16, &x16, float::dot_f16);
            check::<f16, f16, 4>(isa, &w16, &x16, float::dot_f16);
            check::<f16, f16, 5>(isa, &w16, &x16, float::dot_f16);
            check::<f16, f16, 6>(isa, &w16, &x16, float::dot_f16);
        }
    }
}
