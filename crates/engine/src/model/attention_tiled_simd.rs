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

use super::attention_parts::{normalise, Partial, ScoreScale};
use super::attention_tiled::{Query, TILE};
use crate::simd::lanes::{Avx2, Avx512, Lanes};

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
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        if crate::simd::avx512() {
            attend_avx512(queries, view, offset, scale, out)
        } else {
            attend_avx2(queries, view, offset, scale, out)
        }
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
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe { tiled_body::<Avx512>(queries, view, offset, scale, out) }
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
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe { tiled_body::<Avx2>(queries, view, offset, scale, out) }
}

/// Value vectors per query updated together (bounded by the registers).
const VALUE_VECTORS: usize = 4;

/// How many queries go through a tile together: with sixteen lanes (AVX-512) and its 32
/// registers, four queries' score or value accumulators (sixteen vectors) fit beside the
/// operands, and each key or value vector loaded serves all four. Against two, this
/// measured no faster on a Zen 4 (the passes are bound by their multiply-adds, not by
/// the loads); it is what one version generic over the count allows. AVX2's sixteen
/// registers hold one query's.
fn group_size<L: Lanes>() -> usize {
    if L::WIDTH == 16 {
        4
    } else {
        1
    }
}

/// # Safety
/// As for [`attend_tiled`], with `L`'s instructions ([`Lanes`]).
#[inline(always)]
unsafe fn tiled_body<L: Lanes>(
    queries: &[Query<'_>],
    view: LayerView<'_>,
    offset: usize,
    scale: ScoreScale,
    out: &mut [f32],
) {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
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
        let mut state = vec![Partial::EMPTY; queries.len()];
        // Keys transposed: dimension d of key j at d × TILE + j. Values: key j's at j × head_dim.
        let mut keys = vec![0.0f32; head_dim * TILE];
        let mut values = vec![0.0f32; TILE * head_dim];
        let mut row = vec![0.0f32; head_dim];
        let mut active = Vec::with_capacity(queries.len());
        let out_base = out.as_mut_ptr();
        let first_tile = queries.iter().map(|q| q.first).min().unwrap() / TILE;
        let last_tile = queries.iter().map(|q| q.last).max().unwrap() / TILE;
        for tile in first_tile..=last_tile {
            let base = tile * TILE;
            let seen = |q: &Query<'_>| q.first.max(base)..q.last.min(base + TILE - 1) + 1;
            active.clear();
            active.extend((0..queries.len()).filter(|&i| !seen(&queries[i]).is_empty()));
            let Some(lo) = active.iter().map(|&i| seen(&queries[i]).start).min() else {
                continue;
            };
            let hi = active.iter().map(|&i| seen(&queries[i]).end).max().unwrap();
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
            // Query i's accumulator: `head_dim` values of `out` (its length was checked).
            let acc = |i: usize| out_base.add(i * head_dim);
            let mut k = 0;
            while k < active.len() {
                let i = active[k];
                let range = seen(&queries[i]);
                let cells = range.start - base..range.end - base;
                // Following queries that see the same cells of the tile go through it together.
                let together = 1 + active[k + 1..]
                    .iter()
                    .take(group_size::<L>() - 1)
                    .take_while(|&&j| seen(&queries[j]) == range)
                    .count();
                let group = &active[k..k + together];
                match together {
                    4 => through_tile::<L, 4>(
                        group, queries, &keys, &values, scale, &cells, &mut state, acc, head_dim,
                    ),
                    3 => through_tile::<L, 3>(
                        group, queries, &keys, &values, scale, &cells, &mut state, acc, head_dim,
                    ),
                    2 => through_tile::<L, 2>(
                        group, queries, &keys, &values, scale, &cells, &mut state, acc, head_dim,
                    ),
                    _ => {
                        let scores = scores::<L>(queries[i].q, &keys, scale, &cells);
                        let weights =
                            softmax_step::<L, false>(&mut state[i], &scores, acc(i), head_dim);
                        add_values::<L>(acc(i), head_dim, &values, &weights, cells.clone());
                    }
                }
                k += together;
            }
        }
        for (o, s) in out.chunks_exact_mut(head_dim).zip(&state) {
            normalise(o, s.sum);
        }
    }
}

/// `N` queries (indices into `queries`, `N` of them in `group`) that see the same `cells`
/// of the tile, through it together (sixteen lanes only): their scores, each one's softmax
/// step, their weighted values; `acc(i)` is query `i`'s accumulator.
///
/// # Safety
/// As under [`attend_tiled`]: the CPU has `L`'s instructions ([`Lanes`]) and the head size is a
/// multiple of 64; `acc(i)` points at `head_dim` writable values for each query `i` of `group`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn through_tile<L: Lanes, const N: usize>(
    group: &[usize],
    queries: &[Query<'_>],
    keys: &[f32],
    values: &[f32],
    scale: ScoreScale,
    cells: &std::ops::Range<usize>,
    state: &mut [Partial],
    acc: impl Fn(usize) -> *mut f32,
    head_dim: usize,
) {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let group: [usize; N] = group.try_into().unwrap();
        let scores = scores_group::<L, N>(group.map(|i| queries[i].q), keys, scale, cells);
        let mut weights = [[0.0f32; TILE]; N];
        for ((w, s), &i) in weights.iter_mut().zip(&scores).zip(&group) {
            *w = softmax_step::<L, false>(&mut state[i], s, acc(i), head_dim);
        }
        add_values_group::<L, N>(group.map(&acc), head_dim, values, &weights, cells.clone());
    }
}

/// Takes a query's tile of scores into its online softmax (`state`: the largest score so
/// far and the sum of the weights): rescales the accumulator (`head_dim` values at `acc`)
/// and the sum when the maximum rises, adds the tile's weights to the sum (sixteen at a
/// time into an f64), and returns the weights.
///
/// The vision towers' attention (`vision/attention.rs`) takes its tiles' scores through
/// it too, with `AVX2_EXP`: the weights are then ggml's AVX2 `expf`
/// ([`Lanes::expf_avx2`]), not its AVX-512 one, which the text models' bit-parity with
/// llama.cpp's fixtures keeps (and which AVX2 emulates at about twice the cost).
///
/// # Safety
/// The CPU has `L`'s instructions ([`Lanes`]); `head_dim` is a multiple of `L::WIDTH`
/// and `acc` points at `head_dim` writable values.
#[inline(always)]
pub(crate) unsafe fn softmax_step<L: Lanes, const AVX2_EXP: bool>(
    state: &mut Partial,
    scores: &[f32; TILE],
    acc: *mut f32,
    head_dim: usize,
) -> [f32; TILE] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let s = scores.as_ptr();
        let mut top = L::load(s);
        for j in (L::WIDTH..TILE).step_by(L::WIDTH) {
            top = L::max(top, L::load(s.add(j)));
        }
        let new_max = state.max.max(L::hmax(top));
        if new_max > state.max {
            let rescale = (state.max - new_max).exp();
            let r = L::splat(rescale);
            for d in (0..head_dim).step_by(L::WIDTH) {
                L::store(acc.add(d), L::mul(L::load(acc.add(d)), r));
            }
            state.sum *= rescale;
        }
        state.max = new_max;
        let mut weights = [0.0f32; TILE];
        let m = L::splat(new_max);
        for j in (0..TILE).step_by(L::WIDTH) {
            let x = L::sub(L::load(s.add(j)), m);
            let w = if AVX2_EXP {
                L::expf_avx2(x)
            } else {
                L::expf(x)
            };
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
        state.sum = (state.sum as f64 + total) as f32;
        weights
    }
}

/// Scaled (and soft-capped) scores of the tile's `cells` (indices within the tile); the
/// other cells -∞.
#[inline(always)]
fn finish_scores(scores: &mut [f32; TILE], scale: ScoreScale, cells: &std::ops::Range<usize>) {
    if scale.is_capped() {
        for score in &mut scores[cells.clone()] {
            *score = scale.cap(*score);
        }
    }
    scores[..cells.start].fill(f32::NEG_INFINITY);
    scores[cells.end..].fill(f32::NEG_INFINITY);
}

/// The query's scores with the tile's keys, scaled; cells outside `cells` -∞.
///
/// # Safety
/// As under [`attend_tiled`]: the CPU has `L`'s instructions ([`Lanes`]) and the head size is a
/// multiple of 64.
#[inline(always)]
unsafe fn scores<L: Lanes>(
    q: &[f32],
    keys: &[f32],
    scale: ScoreScale,
    cells: &std::ops::Range<usize>,
) -> [f32; TILE] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
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
        let mut scores = [0.0f32; TILE];
        let s = L::splat(scale.factor());
        for (v, a) in acc.iter().take(n).enumerate() {
            L::store(scores.as_mut_ptr().add(v * L::WIDTH), L::mul(*a, s));
        }
        finish_scores(&mut scores, scale, cells);
        scores
    }
}

/// [`scores`] of `N` queries, each key vector loaded once for all (sixteen lanes only).
///
/// # Safety
/// As under [`attend_tiled`]: the CPU has `L`'s instructions ([`Lanes`]) and the head size is a
/// multiple of 64.
// Indexed loops: each loaded vector goes to every query's accumulator in turn.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn scores_group<L: Lanes, const N: usize>(
    q: [&[f32]; N],
    keys: &[f32],
    scale: ScoreScale,
    cells: &std::ops::Range<usize>,
) -> [[f32; TILE]; N] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        const V: usize = TILE / 16;
        debug_assert_eq!(L::WIDTH, 16);
        let mut acc = [[L::zero(); V]; N];
        let k = keys.as_ptr();
        for d in 0..q[0].len() {
            let qd: [L::V; N] = std::array::from_fn(|n| L::splat(*q[n].get_unchecked(d)));
            for v in 0..V {
                let key = L::load(k.add(d * TILE + v * L::WIDTH));
                for n in 0..N {
                    acc[n][v] = L::fmadd(key, qd[n], acc[n][v]);
                }
            }
        }
        let s = L::splat(scale.factor());
        let mut scores = [[0.0f32; TILE]; N];
        for (scores, acc) in scores.iter_mut().zip(&acc) {
            for (v, a) in acc.iter().enumerate() {
                L::store(scores.as_mut_ptr().add(v * L::WIDTH), L::mul(*a, s));
            }
            finish_scores(scores, scale, cells);
        }
        scores
    }
}

/// Adds the weighted values of the tile's keys `seen` (indices within the tile) to the
/// accumulator, one fused multiply-add per key in order.
///
/// # Safety
/// As under [`attend_tiled`]: the CPU has `L`'s instructions ([`Lanes`]) and the head size is a
/// multiple of 64; `acc` points at `head_dim` writable values.
#[inline(always)]
unsafe fn add_values<L: Lanes>(
    acc: *mut f32,
    head_dim: usize,
    values: &[f32],
    weights: &[f32; TILE],
    seen: std::ops::Range<usize>,
) {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
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
}

/// [`add_values`] for `N` queries that see the same keys, each value vector loaded once
/// for all (sixteen lanes only: the head size is a multiple of 64, so every step is
/// [`VALUE_VECTORS`] vectors).
///
/// # Safety
/// As under [`attend_tiled`]: the CPU has `L`'s instructions ([`Lanes`]) and the head size is a
/// multiple of 64; each of `acc` points at `head_dim` writable values.
// Indexed loops: each loaded vector goes to every query's accumulator in turn.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn add_values_group<L: Lanes, const N: usize>(
    acc: [*mut f32; N],
    head_dim: usize,
    values: &[f32],
    weights: &[[f32; TILE]; N],
    seen: std::ops::Range<usize>,
) {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        debug_assert_eq!(L::WIDTH, 16);
        let v = values.as_ptr();
        for d in (0..head_dim).step_by(VALUE_VECTORS * L::WIDTH) {
            let mut a = [[L::zero(); VALUE_VECTORS]; N];
            for (q, a) in a.iter_mut().enumerate() {
                for (h, a) in a.iter_mut().enumerate() {
                    *a = L::load(acc[q].add(d + h * L::WIDTH));
                }
            }
            for j in seen.clone() {
                let w: [L::V; N] = std::array::from_fn(|n| L::splat(weights[n][j]));
                for h in 0..VALUE_VECTORS {
                    let value = L::load(v.add(j * head_dim + d + h * L::WIDTH));
                    for n in 0..N {
                        a[n][h] = L::fmadd(value, w[n], a[n][h]);
                    }
                }
            }
            for (q, a) in a.iter().enumerate() {
                for (h, a) in a.iter().enumerate() {
                    L::store(acc[q].add(d + h * L::WIDTH), *a);
                }
            }
        }
    }
}

/// `n` f16 values converted to f32 into `dst`, a vector at a time.
///
/// # Safety
/// The CPU has `L`'s instructions ([`Lanes`]); `src` reaches `n` readable values and `dst` `n`
/// writable ones, `n` a multiple of the width.
#[inline(always)]
unsafe fn convert_into<L: Lanes>(src: *const half::f16, dst: *mut f32, n: usize) {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        for i in (0..n).step_by(L::WIDTH) {
            L::store(dst.add(i), L::load_f16(src.add(i)));
        }
    }
}
