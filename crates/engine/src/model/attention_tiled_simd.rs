//! The tiled attention kernel of [`super::attention_tiled`] in AVX2 or AVX-512, bit for
//! bit the portable one's results.
//!
//! A task's query rows share each tile's keys and values, converted to f32 once: keys
//! transposed (one vector holds one dimension of `WIDTH` keys, so a vector of scores
//! grows by one fused multiply-add per dimension, each lane in the portable order), values
//! as rows. Then, per query, the tile's scores, the softmax bookkeeping and the weighted
//! values, in the portable kernel's order of operations.

#![cfg(target_arch = "x86_64")]

use crate::kv_cache::LayerView;

use super::attention::{normalise, ScoreScale};
use super::attention_tiled::{Query, TILE};
use super::lanes::{Avx2, Avx512, Lanes};

/// [`super::attention_tiled::TiledKernel`] with AVX-512 where the CPU has it (and
/// `FERRITE_CPU` allows it), AVX2 otherwise.
///
/// # Safety
/// AVX2, FMA and F16C must be available; the head size is a multiple of 64.
pub unsafe fn attend_tiled(
    queries: &[Query<'_>],
    view: LayerView<'_>,
    offset: usize,
    scale: ScoreScale,
    out: &mut [f32],
) {
    if super::attention_simd::avx512_available() {
        attend_avx512(queries, view, offset, scale, out)
    } else {
        attend_avx2(queries, view, offset, scale, out)
    }
}

/// [`attend_tiled`] with AVX-512.
///
/// # Safety
/// As for [`attend_tiled`], and AVX-512F must be available.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn attend_avx512(
    queries: &[Query<'_>],
    view: LayerView<'_>,
    offset: usize,
    scale: ScoreScale,
    out: &mut [f32],
) {
    tiled_body::<Avx512>(queries, view, offset, scale, out)
}

/// [`attend_tiled`] with AVX2 alone.
///
/// # Safety
/// As for [`attend_tiled`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_avx2(
    queries: &[Query<'_>],
    view: LayerView<'_>,
    offset: usize,
    scale: ScoreScale,
    out: &mut [f32],
) {
    tiled_body::<Avx2>(queries, view, offset, scale, out)
}

/// Value vectors per query updated together (bounded by the registers).
const VALUE_VECTORS: usize = 4;

#[inline(always)]
unsafe fn tiled_body<L: Lanes>(
    queries: &[Query<'_>],
    view: LayerView<'_>,
    offset: usize,
    scale: ScoreScale,
    out: &mut [f32],
) {
    let Some(head_dim) = queries.first().map(|q| q.q.len()) else {
        return;
    };
    assert!(
        head_dim.is_multiple_of(64)
            && out.len() == queries.len() * head_dim
            && offset + head_dim <= view.kv_width()
            && queries.iter().all(|q| {
                q.q.len() == head_dim && q.first <= q.last && q.last < view.positions()
            })
    );
    out.fill(0.0);
    let mut max = vec![f32::NEG_INFINITY; queries.len()];
    let mut sum = vec![0.0f32; queries.len()];
    // Keys transposed: dimension d of key j at d × TILE + j. Values: key j's at j × head_dim.
    let mut keys = vec![0.0f32; head_dim * TILE];
    let mut values = vec![0.0f32; TILE * head_dim];
    let mut row = vec![0.0f32; head_dim];
    let first_tile = queries.iter().map(|q| q.first).min().unwrap() / TILE;
    let last_tile = queries.iter().map(|q| q.last).max().unwrap() / TILE;
    for tile in first_tile..=last_tile {
        let base = tile * TILE;
        let seen = |q: &Query<'_>| q.first.max(base)..q.last.min(base + TILE - 1) + 1;
        let overlapping = || {
            queries
                .iter()
                .enumerate()
                .filter(|(_, q)| !seen(q).is_empty())
        };
        let Some(lo) = overlapping().map(|(_, q)| seen(q).start).min() else {
            continue;
        };
        let hi = overlapping().map(|(_, q)| seen(q).end).max().unwrap();
        // Cells outside every query's view stay zero: they are never weighed.
        keys.fill(0.0);
        for p in lo..hi {
            let j = p - base;
            convert_into::<L>(view.keys(p)[offset..].as_ptr(), row.as_mut_ptr(), head_dim);
            for (d, &k) in row.iter().enumerate() {
                keys[d * TILE + j] = k;
            }
            let dst = values[j * head_dim..(j + 1) * head_dim].as_mut_ptr();
            convert_into::<L>(view.values(p)[offset..].as_ptr(), dst, head_dim);
        }
        for (i, query) in overlapping() {
            let seen = seen(query);
            let acc = out[i * head_dim..(i + 1) * head_dim].as_mut_ptr();
            let scores = scores::<L>(query.q, &keys, scale, base, &seen);
            let tile_max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let new_max = max[i].max(tile_max);
            if new_max > max[i] {
                let rescale = (max[i] - new_max).exp();
                let r = L::splat(rescale);
                for d in (0..head_dim).step_by(L::WIDTH) {
                    L::store(acc.add(d), L::mul(L::load(acc.add(d)), r));
                }
                sum[i] *= rescale;
            }
            max[i] = new_max;
            let mut weights = [0.0f32; TILE];
            let m = L::splat(new_max);
            for j in (0..TILE).step_by(L::WIDTH) {
                let w = L::expf(L::sub(L::load(scores.as_ptr().add(j)), m));
                L::store(weights.as_mut_ptr().add(j), w);
            }
            let mut total = 0.0f64;
            for j in (0..TILE).step_by(16) {
                let mut v = [L::zero(); 2];
                for (h, v) in v.iter_mut().take(16 / L::WIDTH).enumerate() {
                    *v = L::load(weights.as_ptr().add(j + h * L::WIDTH));
                }
                total += L::sum16(&v[..16 / L::WIDTH]) as f64;
            }
            sum[i] = (sum[i] as f64 + total) as f32;
            add_values::<L>(
                acc,
                head_dim,
                &values,
                &weights,
                seen.start - base..seen.end - base,
            );
        }
    }
    for (o, &s) in out.chunks_exact_mut(head_dim).zip(&sum) {
        normalise(o, s);
    }
}

/// The query's scores with the tile's keys (`positions` seen, the others -∞), scaled.
#[inline(always)]
unsafe fn scores<L: Lanes>(
    q: &[f32],
    keys: &[f32],
    scale: ScoreScale,
    base: usize,
    seen: &std::ops::Range<usize>,
) -> [f32; TILE] {
    // Sized for the narrowest width; `TILE / WIDTH` of them are used.
    let mut acc = [L::zero(); 8];
    let n = TILE / L::WIDTH;
    let k = keys.as_ptr();
    for (d, &qd) in q.iter().enumerate() {
        let qd = L::splat(qd);
        for (v, a) in acc.iter_mut().take(n).enumerate() {
            *a = L::fmadd(L::load(k.add(d * TILE + v * L::WIDTH)), qd, *a);
        }
    }
    let mut scores = [f32::NEG_INFINITY; TILE];
    let s = L::splat(scale.factor());
    for (v, a) in acc.iter().take(n).enumerate() {
        L::store(scores.as_mut_ptr().add(v * L::WIDTH), L::mul(*a, s));
    }
    for (j, score) in scores.iter_mut().enumerate() {
        *score = if seen.contains(&(base + j)) {
            scale.cap(*score)
        } else {
            f32::NEG_INFINITY
        };
    }
    scores
}

/// Adds the weighted values of the tile's keys `seen` (indices within the tile) to the
/// accumulator, one fused multiply-add per key in order.
#[inline(always)]
unsafe fn add_values<L: Lanes>(
    acc: *mut f32,
    head_dim: usize,
    values: &[f32],
    weights: &[f32; TILE],
    seen: std::ops::Range<usize>,
) {
    let step = VALUE_VECTORS * L::WIDTH;
    let v = values.as_ptr();
    let mut d = 0;
    while d < head_dim {
        let n = ((head_dim - d) / L::WIDTH).min(VALUE_VECTORS);
        let mut a = [L::zero(); VALUE_VECTORS];
        for (h, a) in a.iter_mut().take(n).enumerate() {
            *a = L::load(acc.add(d + h * L::WIDTH));
        }
        for j in seen.clone() {
            let w = L::splat(weights[j]);
            for (h, a) in a.iter_mut().take(n).enumerate() {
                *a = L::fmadd(L::load(v.add(j * head_dim + d + h * L::WIDTH)), w, *a);
            }
        }
        for (h, a) in a.iter().take(n).enumerate() {
            L::store(acc.add(d + h * L::WIDTH), *a);
        }
        d += step.min(n * L::WIDTH);
    }
}

/// `n` f16 values converted to f32 into `dst`, a vector at a time.
#[inline(always)]
unsafe fn convert_into<L: Lanes>(src: *const half::f16, dst: *mut f32, n: usize) {
    for i in (0..n).step_by(L::WIDTH) {
        L::store(dst.add(i), L::load_f16(src.add(i)));
    }
}
