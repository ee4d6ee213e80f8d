//! llama.cpp's tiled flash attention (ggml's `flash_attn_ext_tiled`), which it uses for
//! micro-batches of 64 query rows or more, in portable code.
//!
//! Keys are visited in tiles of 64 cells aligned to multiples of 64. Per tile, a query
//! row's scores are f32 dot products of the f32 query with the keys (one fused
//! multiply-add per dimension, in order), scaled; the tile's largest score updates the
//! running maximum (rescaling the accumulator and the sum with `expf` when it rises); the
//! weights are ggml's vector `expf` of score minus maximum, added up sixteen at a time
//! (`_mm512_reduce_add_ps`) into an f64 sum that is added to the f32 running sum; each
//! value dimension accumulates in f32, one fused multiply-add per key, in order. Cells a
//! row may not see weigh zero and change nothing. `attention_tiled_simd.rs` computes the
//! same bits with AVX2 or AVX-512.

use crate::kv_cache::LayerView;

use super::attention::{normalise, ScoreScale};
use crate::simd::reduce::reduce_add_16;

/// Cells per tile (`GGML_FA_TILE_KV`).
pub(super) const TILE: usize = 64;

/// One query row of one head, and the positions it sees: `first..=last`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Query<'a> {
    /// The query, `head_dim` values.
    pub(super) q: &'a [f32],
    /// The first position it sees.
    pub(super) first: usize,
    /// Its own position, the last it sees.
    pub(super) last: usize,
}

/// The tiled kernel for some query rows attending with one KV head (`offset` is where the
/// head starts within a position's keys and values): each row's normalised output goes to
/// `out`, `head_dim` values per query.
pub(super) type TiledKernel = unsafe fn(
    queries: &[Query<'_>],
    view: LayerView<'_>,
    offset: usize,
    scale: ScoreScale,
    out: &mut [f32],
);

/// [`TiledKernel`] in portable code.
///
/// # Safety
/// None: the signature is `unsafe` to match the SIMD versions.
pub(super) unsafe fn attend_tiled_portable(
    queries: &[Query<'_>],
    view: LayerView<'_>,
    offset: usize,
    scale: ScoreScale,
    out: &mut [f32],
) {
    let Some(head_dim) = queries.first().map(|q| q.q.len()) else {
        return;
    };
    for (query, out) in queries.iter().zip(out.chunks_exact_mut(head_dim)) {
        attend_row(query, view, offset, scale, out);
    }
}

fn attend_row(
    query: &Query<'_>,
    view: LayerView<'_>,
    offset: usize,
    scale: ScoreScale,
    out: &mut [f32],
) {
    let head_dim = query.q.len();
    out.fill(0.0);
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
    for tile in query.first / TILE..=query.last / TILE {
        let base = tile * TILE;
        let seen = query.first.max(base)..query.last.min(base + TILE - 1) + 1;
        let mut scores = [f32::NEG_INFINITY; TILE];
        for p in seen.clone() {
            let key = &view.keys(p)[offset..offset + head_dim];
            let mut s = 0.0f32;
            for (k, q) in key.iter().zip(query.q) {
                s = k.to_f32().mul_add(*q, s);
            }
            scores[p - base] = scale.apply(s);
        }
        let tile_max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let new_max = max.max(tile_max);
        if new_max > max {
            let rescale = (max - new_max).exp();
            for o in out.iter_mut() {
                *o *= rescale;
            }
            sum *= rescale;
        }
        max = new_max;
        let weights = scores.map(|s| expf(s - max));
        sum = (sum as f64 + tile_sum(&weights)) as f32;
        for p in seen {
            let value = &view.values(p)[offset..offset + head_dim];
            let w = weights[p - base];
            for (o, v) in out.iter_mut().zip(value) {
                *o = v.to_f32().mul_add(w, *o);
            }
        }
    }
    normalise(out, sum);
}

/// A tile's weights added as `ggml_vec_soft_max_f32` does with AVX-512: sixteen at a time
/// by `_mm512_reduce_add_ps`, those partial sums added in order in f64.
pub(super) fn tile_sum(weights: &[f32; TILE]) -> f64 {
    let mut total = 0.0f64;
    for chunk in weights.chunks_exact(16) {
        total += reduce_add_16(chunk.try_into().unwrap()) as f64;
    }
    total
}

/// Constants of ggml's AVX-512 `ggml_v_expf`, as f32 bit patterns.
pub(super) mod expf_consts {
    /// 0x1.8p23: adding and subtracting it rounds to an integer.
    pub const ROUND: u32 = 0x4b40_0000;
    /// 0x1.715476p+0: log2(e).
    pub const LOG2E: u32 = 0x3fb8_aa3b;
    /// 0x1.62e4p-1 and 0x1.7f7d1cp-20: ln 2 in two parts.
    pub const LN2_HI: u32 = 0x3f31_7200;
    /// See [`LN2_HI`].
    pub const LN2_LO: u32 = 0x35bf_be8e;
    /// The polynomial's coefficients, highest degree first: 0x1.0e4020p-7,
    /// 0x1.573e2ep-5, 0x1.555e66p-3, 0x1.fffdb6p-2, 0x1.ffffecp-1.
    pub const C: [u32; 5] = [
        0x3c07_2010,
        0x3d2b_9f17,
        0x3e2a_af33,
        0x3eff_fedb,
        0x3f7f_fff6,
    ];
    /// Beyond this magnitude of the exponent the result is 0 or infinity.
    pub const LIMIT: f32 = 192.0;
}

/// ggml's vectorised `expf` (AVX-512 `ggml_v_expf`) for one value: `x = n ln 2 + b` with
/// `n` an integer, a degree-5 polynomial in `b`, scaled by `2^n` with a single rounding
/// (`_mm512_scalef_ps`). Not libm's `expf`: the last bit differs for some inputs.
pub(super) fn expf(x: f32) -> f32 {
    use expf_consts::*;
    let c = |bits: u32| f32::from_bits(bits);
    let r = c(ROUND);
    let z = x.mul_add(c(LOG2E), r);
    let n = z - r;
    let b = (-n).mul_add(c(LN2_LO), (-n).mul_add(c(LN2_HI), x));
    if n.abs() > LIMIT {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let high = c(C[0]).mul_add(b, c(C[1]));
    let middle = c(C[2]).mul_add(b, c(C[3]));
    let low = c(C[4]).mul_add(b, 1.0);
    let j = high.mul_add(u, middle).mul_add(u, low);
    scale_by_power_of_two(j, n)
}

/// `j × 2^n` rounded once to f32, as `_mm512_scalef_ps` does for an integral `n` within
/// ±192 (exact in f64, then one rounding).
pub(super) fn scale_by_power_of_two(j: f32, n: f32) -> f32 {
    if n.is_nan() || j.is_nan() {
        return f32::NAN;
    }
    (j as f64 * 2f64.powi(n as i32)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_expf_is_close_to_exp() {
        for i in -2000..=200 {
            let x = i as f32 * 0.0437;
            let (got, want) = (expf(x), (x as f64).exp());
            let rel = ((got as f64 - want) / want).abs();
            assert!(
                rel < 3e-7 || (want < 1e-37 && (got as f64 - want).abs() < 1e-44),
                "{x}: {got} vs {want}"
            );
        }
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(100.0), f32::INFINITY);
    }

    /// The portable port against the vector versions (`lanes.rs`): AVX-512's is ggml's
    /// instruction sequence itself, AVX2's emulates its `scalef` in f64.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn ggml_expf_port_matches_the_vector_versions() {
        use super::super::lanes::{Avx2, Avx512, Lanes};
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx2,fma,f16c,avx512f")]
        unsafe fn expf512(x: &[f32; 16]) -> [f32; 16] {
            let mut out = [0f32; 16];
            _mm512_storeu_ps(out.as_mut_ptr(), Avx512::expf(_mm512_loadu_ps(x.as_ptr())));
            out
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn expf256(x: &[f32; 16]) -> [f32; 16] {
            let mut out = [0f32; 16];
            for h in [0, 8] {
                let v = Avx2::expf(_mm256_loadu_ps(x.as_ptr().add(h)));
                _mm256_storeu_ps(out.as_mut_ptr().add(h), v);
            }
            out
        }
        let cpu = crate::simd::cpu::detected();
        let (wide, narrow) = (
            !crate::simd::cpu::lacks(cpu.avx512, "AVX-512"),
            !crate::simd::cpu::lacks(cpu.avx2, "AVX2"),
        );
        let mut rng = crate::quant::sample::Xorshift::new(11);
        for round in 0..20_000 {
            // Mostly the softmax's range, with the underflow edge and beyond.
            let spread = [1.0f32, 30.0, 110.0, 140.0][round % 4];
            let mut x: [f32; 16] = std::array::from_fn(|_| rng.next_f32() * spread);
            x[round % 16] = [f32::NEG_INFINITY, -200.0, 95.0, f32::NAN][round % 4];
            let want = x.map(expf);
            // SAFETY: each version runs only where the CPU has its features.
            let versions = unsafe {
                [
                    ("AVX-512", wide.then(|| expf512(&x))),
                    ("AVX2", narrow.then(|| expf256(&x))),
                ]
            };
            for (name, got) in versions {
                let Some(got) = got else { continue };
                for ((x, w), g) in x.iter().zip(want).zip(got) {
                    let same = w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan());
                    assert!(same, "{name} expf({x}): {g} against {w}");
                }
            }
        }
    }
}
