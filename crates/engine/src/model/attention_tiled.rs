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

use super::attention_parts::{normalise, ScoreScale};
use crate::simd::reduce::reduce_add_16;

/// Cells per tile (`GGML_FA_TILE_KV`).
pub(crate) const TILE: usize = 64;

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
        let weights = scores.map(|s| crate::simd::ggml_expf::expf(s - max));
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
pub(crate) fn tile_sum(weights: &[f32; TILE]) -> f64 {
    let mut total = 0.0f64;
    for chunk in weights.chunks_exact(16) {
        total += reduce_add_16(chunk.try_into().unwrap()) as f64;
    }
    total
}
