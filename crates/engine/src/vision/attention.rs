//! The vision tower's attention: every patch sees every patch, with the numerics of
//! llama.cpp's tiled flash attention (the tower's batch is one micro-batch of every
//! patch, so ggml takes its tiled kernel; `model/attention_tiled.rs` describes it): keys
//! and values rounded to f16, keys visited in tiles of 64, a query's scores f32 fused
//! multiply-adds over the dimensions in order, the online softmax's weights ggml's
//! `expf`, each tile's sixteen at a time into an f64 sum, values accumulated in f32.
//!
//! The keys and values are laid out once per head for the whole image: each tile's keys
//! transposed (one row of 64 keys per dimension, so that a vector of scores grows by one
//! fused multiply-add per dimension), values as rows padded with zeros to whole vectors.
//! Queries go through the tiles in blocks that share each tile while it is in cache. The
//! softmax step of the vector versions is the text model's own (`model::softmax_step`).
//! The AVX2 and AVX-512 versions, written once over [`Lanes`], give the portable one's
//! bits (a test checks).

use std::ops::Range;

use half::f16;

#[cfg(target_arch = "x86_64")]
use crate::model::softmax_step;
use crate::model::{normalise, tile_sum, Partial, ATTENTION_TILE as TILE};
#[cfg(target_arch = "x86_64")]
use crate::simd::lanes::{Avx2, Avx512, Lanes};
use crate::threads;

/// Query rows that go through each tile together.
const BLOCK: usize = 16;
/// Value rows are padded to a multiple of this (the widest vector).
const PAD: usize = 16;

/// Every head's keys and values of one image, laid out for [`attend`].
pub(super) struct HeadsKv {
    heads: usize,
    head_dim: usize,
    /// Patches.
    n: usize,
    /// `[head][tile][dimension][64 keys]`, f16-rounded, zeros past the last patch.
    keys: Vec<f32>,
    /// `[head][patch][padded head_dim]`, f16-rounded, zeros in the padding.
    values: Vec<f32>,
}

impl HeadsKv {
    /// The layout of `k` and `v` (rows of `heads * head_dim` values, one per patch).
    pub(super) fn new(k: &[f32], v: &[f32], heads: usize, head_dim: usize) -> Self {
        let d = heads * head_dim;
        let n = k.len() / d;
        let tiles = n.div_ceil(TILE);
        let padded = head_dim.next_multiple_of(PAD);
        let round = |x: f32| f16::from_f32(x).to_f32();
        let mut keys = vec![0f32; heads * tiles * head_dim * TILE];
        let mut values = vec![0f32; heads * n * padded];
        for (p, (krow, vrow)) in k.chunks_exact(d).zip(v.chunks_exact(d)).enumerate() {
            let (t, j) = (p / TILE, p % TILE);
            for h in 0..heads {
                let tile = &mut keys[(h * tiles + t) * head_dim * TILE..][..head_dim * TILE];
                for (i, x) in krow[h * head_dim..][..head_dim].iter().enumerate() {
                    tile[i * TILE + j] = round(*x);
                }
                let dst = &mut values[(h * n + p) * padded..][..head_dim];
                for (o, x) in dst.iter_mut().zip(&vrow[h * head_dim..][..head_dim]) {
                    *o = round(*x);
                }
            }
        }
        Self {
            heads,
            head_dim,
            n,
            keys,
            values,
        }
    }

    fn tiles(&self) -> usize {
        self.n.div_ceil(TILE)
    }

    fn padded(&self) -> usize {
        self.head_dim.next_multiple_of(PAD)
    }

    /// Head `h`'s keys of tile `t`: one row of 64 per dimension.
    fn tile_keys(&self, h: usize, t: usize) -> &[f32] {
        let size = self.head_dim * TILE;
        &self.keys[(h * self.tiles() + t) * size..][..size]
    }

    /// Head `h`'s value rows of tile `t` (as many as it has patches).
    fn tile_values(&self, h: usize, t: usize) -> &[f32] {
        let p = self.padded();
        let cells = self.cells(t);
        &self.values[(h * self.n + t * TILE) * p..][..cells * p]
    }

    /// Patches in tile `t`.
    fn cells(&self, t: usize) -> usize {
        TILE.min(self.n - t * TILE)
    }
}

/// One query's online softmax: the largest score so far and the sum of the weights, and
/// the weighted values (`padded` of them).
struct State {
    part: Partial,
    acc: Vec<f32>,
}

/// The cells of a tile a query sees: `lo..hi` of its 64 (the others, and those past the
/// last patch, -∞).
#[derive(Debug, Clone, Copy)]
struct Seen {
    lo: usize,
    hi: usize,
}

/// The kernel of a block of queries (`qs`, one state each) and one tile: each query's
/// scores, softmax step and weighted values.
type TileStep = fn(
    qs: &[&[f32]],
    kv: &HeadsKv,
    h: usize,
    t: usize,
    seen: Seen,
    scale: f32,
    states: &mut [State],
);

/// Attention of the queries in `q` (rows of `heads * head_dim` values) over the patches
/// `keys` (every patch, or an attention window's), scores scaled by `scale`, into `out`
/// (the same shape as `q`). As ggml's masked kernel: the tiles are the whole image's,
/// cells outside `keys` weigh nothing, tiles without any of `keys` are skipped.
pub(super) fn attend(q: &[f32], kv: &HeadsKv, keys: Range<usize>, scale: f32, out: &mut [f32]) {
    attend_with(step_for_cpu(), q, kv, keys, scale, out)
}

/// The fastest [`TileStep`] this CPU runs.
fn step_for_cpu() -> TileStep {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::avx512() {
            return step_avx512;
        }
        if crate::simd::avx2() {
            return step_avx2;
        }
    }
    step_portable
}

fn attend_with(
    step: TileStep,
    q: &[f32],
    kv: &HeadsKv,
    keys: Range<usize>,
    scale: f32,
    out: &mut [f32],
) {
    assert!(
        keys.start < keys.end && keys.end <= kv.n,
        "{keys:?} of {} patches",
        kv.n
    );
    let (heads, head_dim) = (kv.heads, kv.head_dim);
    let d = heads * head_dim;
    let rows = q.len() / d;
    // Whole blocks of rows (the last one padded, its extra rows dropped).
    let mut blocks = vec![0f32; rows.next_multiple_of(BLOCK) * d];
    threads::for_each_rows(&mut blocks, BLOCK * d, |b, block| {
        let first = b * BLOCK;
        let count = BLOCK.min(rows - first);
        let mut states: Vec<State> = (0..count)
            .map(|_| State {
                part: Partial::EMPTY,
                acc: vec![0f32; kv.padded()],
            })
            .collect();
        for h in 0..heads {
            for s in states.iter_mut() {
                s.part = Partial::EMPTY;
                s.acc.fill(0.0);
            }
            let qs: Vec<&[f32]> = (0..count)
                .map(|i| &q[(first + i) * d + h * head_dim..][..head_dim])
                .collect();
            for t in keys.start / TILE..keys.end.div_ceil(TILE) {
                let seen = Seen {
                    lo: keys.start.saturating_sub(t * TILE),
                    hi: (keys.end - t * TILE).min(kv.cells(t)),
                };
                step(&qs, kv, h, t, seen, scale, &mut states);
            }
            for (i, s) in states.iter().enumerate() {
                let o = &mut block[i * d + h * head_dim..][..head_dim];
                o.copy_from_slice(&s.acc[..head_dim]);
                normalise(o, s.part.sum);
            }
        }
    });
    out.copy_from_slice(&blocks[..rows * d]);
}

/// [`TileStep`] in portable code: the order of operations every version follows, for
/// each query of the block.
fn step_portable(
    qs: &[&[f32]],
    kv: &HeadsKv,
    h: usize,
    t: usize,
    seen: Seen,
    scale: f32,
    states: &mut [State],
) {
    for (q, state) in qs.iter().zip(states) {
        step_one_portable(q, kv, h, t, seen, scale, state);
    }
}

fn step_one_portable(
    q: &[f32],
    kv: &HeadsKv,
    h: usize,
    t: usize,
    seen: Seen,
    scale: f32,
    state: &mut State,
) {
    let keys = kv.tile_keys(h, t);
    let mut scores = [0f32; TILE];
    for (d, row) in keys.chunks_exact(TILE).enumerate() {
        for (s, k) in scores.iter_mut().zip(row) {
            *s = k.mul_add(q[d], *s);
        }
    }
    for (j, s) in scores.iter_mut().enumerate() {
        *s = if (seen.lo..seen.hi).contains(&j) {
            *s * scale
        } else {
            f32::NEG_INFINITY
        };
    }
    let tile_max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let part = &mut state.part;
    let new_max = part.max.max(tile_max);
    if new_max > part.max {
        let rescale = (part.max - new_max).exp();
        state.acc.iter_mut().for_each(|a| *a *= rescale);
        part.sum *= rescale;
    }
    part.max = new_max;
    let weights = scores.map(|s| crate::simd::ggml_expf::expf(s - new_max));
    part.sum = (part.sum as f64 + tile_sum(&weights)) as f32;
    let p = kv.padded();
    for (w, v) in weights.iter().zip(kv.tile_values(h, t).chunks_exact(p)) {
        for (a, v) in state.acc.iter_mut().zip(v) {
            *a = v.mul_add(*w, *a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn step_avx2(
    qs: &[&[f32]],
    kv: &HeadsKv,
    h: usize,
    t: usize,
    seen: Seen,
    scale: f32,
    states: &mut [State],
) {
    // SAFETY: chosen by `step_for_cpu` only where the CPU has AVX2, FMA and F16C.
    unsafe { step_avx2_inner(qs, kv, h, t, seen, scale, states) }
}

#[cfg(target_arch = "x86_64")]
fn step_avx512(
    qs: &[&[f32]],
    kv: &HeadsKv,
    h: usize,
    t: usize,
    seen: Seen,
    scale: f32,
    states: &mut [State],
) {
    // SAFETY: chosen by `step_for_cpu` only where the CPU has AVX-512F besides.
    unsafe { step_avx512_inner(qs, kv, h, t, seen, scale, states) }
}

/// [`step_lanes`] with AVX2.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn step_avx2_inner(
    qs: &[&[f32]],
    kv: &HeadsKv,
    h: usize,
    t: usize,
    seen: Seen,
    scale: f32,
    states: &mut [State],
) {
    // SAFETY: the caller upholds this function's contract, all step_lanes needs.
    unsafe { step_lanes::<Avx2>(qs, kv, h, t, seen, scale, states) }
}

/// [`step_lanes`] with AVX-512.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn step_avx512_inner(
    qs: &[&[f32]],
    kv: &HeadsKv,
    h: usize,
    t: usize,
    seen: Seen,
    scale: f32,
    states: &mut [State],
) {
    // SAFETY: the caller upholds this function's contract, all step_lanes needs.
    unsafe { step_lanes::<Avx512>(qs, kv, h, t, seen, scale, states) }
}

/// [`step_portable`] in vectors of `L`'s width: the same operations on the same values in
/// the same order, lane by lane. The block's queries take the tile's keys, then their
/// softmax steps, then the tile's values, each phase's data small enough to stay in the
/// first-level cache.
///
/// # Safety
/// The CPU has `L`'s instructions ([`Lanes`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn step_lanes<L: Lanes>(
    qs: &[&[f32]],
    kv: &HeadsKv,
    h: usize,
    t: usize,
    seen: Seen,
    scale: f32,
    states: &mut [State],
) {
    // SAFETY: the CPU has L's instructions (the caller's contract); every load and store
    // below is of whole vectors inside a tile's 64 scores or weights, a tile's key rows
    // (64 each) or a padded value row and accumulator (multiples of 16).
    unsafe {
        let cells = kv.cells(t);
        let mut weights = [[0f32; TILE]; BLOCK];
        for ((q, state), w) in qs.iter().zip(states.iter_mut()).zip(weights.iter_mut()) {
            let scores = scores_lanes::<L>(q, kv.tile_keys(h, t), scale, seen);
            let acc = state.acc.as_mut_ptr();
            *w = softmax_step::<L>(&mut state.part, &scores, acc, state.acc.len());
        }
        let p = kv.padded();
        let values = kv.tile_values(h, t).as_ptr();
        for (state, w) in states.iter_mut().zip(&weights) {
            // The accumulator held in registers, a few vectors at a time, through the
            // tile's keys (each value still gets its keys' products in order).
            let a = state.acc.as_mut_ptr();
            let w = &w[..cells];
            let mut i = 0;
            while i < p {
                let left = (p - i) / L::WIDTH;
                i += L::WIDTH
                    * match left {
                        // As many accumulators as AVX2's sixteen registers leave room
                        // for (SigLIP's 72-wide heads are ten vectors): the more
                        // independent chains of fused multiply-adds, the less each waits.
                        12.. => add_values::<L, 12>(a.add(i), values.add(i), p, w),
                        10.. => add_values::<L, 10>(a.add(i), values.add(i), p, w),
                        8.. => add_values::<L, 8>(a.add(i), values.add(i), p, w),
                        6.. => add_values::<L, 6>(a.add(i), values.add(i), p, w),
                        4.. => add_values::<L, 4>(a.add(i), values.add(i), p, w),
                        2.. => add_values::<L, 2>(a.add(i), values.add(i), p, w),
                        _ => add_values::<L, 1>(a.add(i), values.add(i), p, w),
                    };
            }
        }
    }
}

/// A query's scaled scores against a tile's keys (one row of 64 per dimension); cells
/// outside `seen` -∞.
///
/// # Safety
/// The CPU has `L`'s instructions ([`Lanes`]); `keys` holds `q.len()` rows of 64.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scores_lanes<L: Lanes>(q: &[f32], keys: &[f32], scale: f32, seen: Seen) -> [f32; TILE] {
    // SAFETY: the caller upholds this function's contract; loads are inside `keys`'
    // rows of 64 and stores inside `scores`.
    unsafe {
        let keys = keys.as_ptr();
        let vectors = TILE / L::WIDTH;
        let mut acc = [L::zero(); 8];
        for (d, &qd) in q.iter().enumerate() {
            let qv = L::splat(qd);
            let row = keys.add(d * TILE);
            for (c, a) in acc.iter_mut().take(vectors).enumerate() {
                *a = L::fmadd(L::load(row.add(c * L::WIDTH)), qv, *a);
            }
        }
        let mut scores = [0f32; TILE];
        let sv = L::splat(scale);
        for (c, a) in acc.iter().take(vectors).enumerate() {
            L::store(scores.as_mut_ptr().add(c * L::WIDTH), L::mul(*a, sv));
        }
        scores[..seen.lo].fill(f32::NEG_INFINITY);
        scores[seen.hi..].fill(f32::NEG_INFINITY);
        scores
    }
}

/// `N` vectors of an accumulator at `acc`, each plus the weighted values of the rows at
/// `values` (`stride` apart, one per weight), in order; returns `N`.
///
/// # Safety
/// The CPU has `L`'s instructions ([`Lanes`]); `acc` reaches `N` vectors of writable
/// values and each of `weights.len()` rows at `values` `N` readable ones.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn add_values<L: Lanes, const N: usize>(
    acc: *mut f32,
    values: *const f32,
    stride: usize,
    weights: &[f32],
) -> usize {
    // SAFETY: the caller upholds this function's contract, all these loads and stores
    // need.
    unsafe {
        let mut regs = [L::zero(); N];
        for (k, r) in regs.iter_mut().enumerate() {
            *r = L::load(acc.add(k * L::WIDTH));
        }
        for (j, &w) in weights.iter().enumerate() {
            let wv = L::splat(w);
            let row = values.add(j * stride);
            for (k, r) in regs.iter_mut().enumerate() {
                *r = L::fmadd(L::load(row.add(k * L::WIDTH)), wv, *r);
            }
        }
        for (k, r) in regs.iter().enumerate() {
            L::store(acc.add(k * L::WIDTH), *r);
        }
        N
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed);
                (x % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// The AVX2 and AVX-512 versions give the portable one's bits, on a head width that
    /// is not a multiple of a vector and a patch count that ends inside a tile and a
    /// block.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_vector_versions_give_the_portable_bits() {
        let (heads, head_dim, n) = (3, 72, 150);
        let d = heads * head_dim;
        let (q, k, v) = (values(n * d, 1), values(n * d, 2), values(n * d, 3));
        let kv = HeadsKv::new(&k, &v, heads, head_dim);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut steps: Vec<(&str, TileStep)> = Vec::new();
        if crate::simd::avx2() {
            steps.push(("avx2", step_avx2));
        }
        if crate::simd::avx512() {
            steps.push(("avx512", step_avx512));
        }
        // Every patch, and a window that starts and ends inside tiles.
        for keys in [0..n, 50..139] {
            let mut want = vec![0f32; n * d];
            attend_with(step_portable, &q, &kv, keys.clone(), scale, &mut want);
            for (name, step) in &steps {
                let mut got = vec![0f32; n * d];
                attend_with(*step, &q, &kv, keys.clone(), scale, &mut got);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{name} over {keys:?}");
            }
        }
    }

    /// Against the definition in f64: softmax of the scaled scores over every patch, or
    /// over a window's, weighting the values (f16-rounded keys and values on both sides).
    #[test]
    fn attention_is_the_softmax_weighted_values() {
        let (heads, head_dim, n) = (2, 8, 140);
        let d = heads * head_dim;
        let (q, k, v) = (values(n * d, 4), values(n * d, 5), values(n * d, 6));
        let kv = HeadsKv::new(&k, &v, heads, head_dim);
        for keys in [0..n, 60..70, 70..140] {
            let mut got = vec![0f32; n * d];
            attend(&q, &kv, keys.clone(), 0.5, &mut got);
            check_against_f64(&q, &k, &v, heads, head_dim, keys, &got);
        }
    }

    fn check_against_f64(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        heads: usize,
        head_dim: usize,
        keys: Range<usize>,
        got: &[f32],
    ) {
        let d = heads * head_dim;
        let n = q.len() / d;
        let r = |x: f32| f16::from_f32(x).to_f32() as f64;
        for i in 0..n {
            for h in 0..heads {
                let at = |row: usize| row * d + h * head_dim;
                let scores: Vec<f64> = keys
                    .clone()
                    .map(|j| {
                        (0..head_dim)
                            .map(|c| q[at(i) + c] as f64 * r(k[at(j) + c]))
                            .sum::<f64>()
                            * 0.5
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = w.iter().sum();
                for c in 0..head_dim {
                    let want: f64 = keys
                        .clone()
                        .zip(&w)
                        .map(|(j, w)| w * r(v[at(j) + c]))
                        .sum::<f64>()
                        / total;
                    let g = got[at(i) + c] as f64;
                    assert!(
                        (g - want).abs() < 1e-5,
                        "row {i} head {h} dim {c}: {g} vs {want}"
                    );
                }
            }
        }
    }
}
