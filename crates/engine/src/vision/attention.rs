//! The vision tower's attention: every patch sees every patch, with the numerics of
//! llama.cpp's tiled flash attention (the tower's batch is one micro-batch of every
//! patch, so ggml takes its tiled kernel; `model/attention_tiled.rs` describes it): keys
//! and values rounded to f16, keys visited in tiles of 64, a query's scores f32 fused
//! multiply-adds over the dimensions in order, the online softmax's weights ggml's AVX2
//! `expf` (what llama.cpp's softmax runs on an AVX2 CPU, and half the AVX-512 version's
//! cost where AVX2 has to emulate it), each tile's sixteen at a time into an f64 sum,
//! values accumulated in f32.
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
const BLOCK: usize = 64;
/// Value rows are padded to a multiple of the widest vector this CPU's kernel takes
/// (SigLIP's 72-wide heads: 80 values with AVX-512, 72 otherwise).
fn pad() -> usize {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::avx512() {
        return 16;
    }
    8
}

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
    /// A value row's length ([`pad`]).
    padded: usize,
}

impl HeadsKv {
    /// The layout of `k` and `v` (rows of `heads * head_dim` values, one per patch).
    pub(super) fn new(k: &[f32], v: &[f32], heads: usize, head_dim: usize) -> Self {
        let d = heads * head_dim;
        let n = k.len() / d;
        let tiles = n.div_ceil(TILE);
        let padded = head_dim.next_multiple_of(pad());
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
            padded,
        }
    }

    fn tiles(&self) -> usize {
        self.n.div_ceil(TILE)
    }

    fn padded(&self) -> usize {
        self.padded
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

/// One head's tile of keys and values as a block of queries sees it.
#[derive(Clone, Copy)]
struct Tile<'a> {
    kv: &'a HeadsKv,
    head: usize,
    /// Which tile of the head's.
    index: usize,
    /// The cells the queries see: `lo..hi` of its 64 (the others, and those past the last
    /// patch, -∞).
    lo: usize,
    hi: usize,
    /// The scores' scale.
    scale: f32,
}

impl Tile<'_> {
    /// Its keys: one row of 64 per dimension.
    fn keys(&self) -> &[f32] {
        self.kv.tile_keys(self.head, self.index)
    }

    /// Its value rows (as many as it has patches).
    fn values(&self) -> &[f32] {
        self.kv.tile_values(self.head, self.index)
    }

    /// Patches in it.
    fn cells(&self) -> usize {
        self.kv.cells(self.index)
    }
}

/// The kernel of a block of queries (`qs`, one state each) and one tile: each query's
/// scores, softmax step and weighted values.
type TileStep = fn(qs: &[&[f32]], tile: Tile<'_>, states: &mut [State]);

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
    // One task per block of rows and head (as many as the threads can share even for a
    // few rows), each into its own `BLOCK x head_dim` piece: the last block padded, its
    // extra rows dropped.
    let blocks = rows.div_ceil(BLOCK);
    let mut pieces = vec![0f32; blocks * heads * BLOCK * head_dim];
    threads::for_each_rows(&mut pieces, BLOCK * head_dim, |task, piece| {
        let (b, h) = (task / heads, task % heads);
        let first = b * BLOCK;
        let count = BLOCK.min(rows - first);
        let mut states: Vec<State> = (0..count)
            .map(|_| State {
                part: Partial::EMPTY,
                acc: vec![0f32; kv.padded()],
            })
            .collect();
        let qs: Vec<&[f32]> = (0..count)
            .map(|i| &q[(first + i) * d + h * head_dim..][..head_dim])
            .collect();
        for t in keys.start / TILE..keys.end.div_ceil(TILE) {
            let tile = Tile {
                kv,
                head: h,
                index: t,
                lo: keys.start.saturating_sub(t * TILE),
                hi: (keys.end - t * TILE).min(kv.cells(t)),
                scale,
            };
            step(&qs, tile, &mut states);
        }
        for (o, s) in piece.chunks_exact_mut(head_dim).zip(&states) {
            o.copy_from_slice(&s.acc[..head_dim]);
            normalise(o, s.part.sum);
        }
    });
    for (task, piece) in pieces.chunks_exact(BLOCK * head_dim).enumerate() {
        let (b, h) = (task / heads, task % heads);
        for (i, o) in piece.chunks_exact(head_dim).enumerate() {
            let row = b * BLOCK + i;
            if row < rows {
                out[row * d + h * head_dim..][..head_dim].copy_from_slice(o);
            }
        }
    }
}

/// [`TileStep`] in portable code: the order of operations every version follows, for
/// each query of the block.
fn step_portable(qs: &[&[f32]], tile: Tile<'_>, states: &mut [State]) {
    for (q, state) in qs.iter().zip(states) {
        step_one_portable(q, tile, state);
    }
}

fn step_one_portable(q: &[f32], tile: Tile<'_>, state: &mut State) {
    let keys = tile.keys();
    let mut scores = [0f32; TILE];
    for (d, row) in keys.chunks_exact(TILE).enumerate() {
        for (s, k) in scores.iter_mut().zip(row) {
            *s = k.mul_add(q[d], *s);
        }
    }
    for (j, s) in scores.iter_mut().enumerate() {
        *s = if (tile.lo..tile.hi).contains(&j) {
            *s * tile.scale
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
    let weights = scores.map(|s| crate::simd::ggml_expf::expf_avx2(s - new_max));
    part.sum = (part.sum as f64 + tile_sum(&weights)) as f32;
    let p = tile.kv.padded();
    for (w, v) in weights.iter().zip(tile.values().chunks_exact(p)) {
        for (a, v) in state.acc.iter_mut().zip(v) {
            *a = v.mul_add(*w, *a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn step_avx2(qs: &[&[f32]], tile: Tile<'_>, states: &mut [State]) {
    // SAFETY: chosen by `step_for_cpu` only where the CPU has AVX2, FMA and F16C.
    unsafe { step_avx2_inner(qs, tile, states) }
}

#[cfg(target_arch = "x86_64")]
fn step_avx512(qs: &[&[f32]], tile: Tile<'_>, states: &mut [State]) {
    // SAFETY: chosen by `step_for_cpu` only where the CPU has AVX-512F besides.
    unsafe { step_avx512_inner(qs, tile, states) }
}

/// [`step_lanes`] with AVX2.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn step_avx2_inner(qs: &[&[f32]], tile: Tile<'_>, states: &mut [State]) {
    // SAFETY: the caller upholds this function's contract, all step_lanes needs.
    unsafe { step_lanes::<Avx2>(qs, tile, states) }
}

/// [`step_lanes`] with AVX-512.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn step_avx512_inner(qs: &[&[f32]], tile: Tile<'_>, states: &mut [State]) {
    // SAFETY: the caller upholds this function's contract, all step_lanes needs.
    unsafe { step_lanes::<Avx512>(qs, tile, states) }
}

/// [`step_portable`] in vectors of `L`'s width: the same operations on the same values in
/// the same order for every score and every accumulated value, computed a few queries at
/// a time. The block's queries take the tile's keys, then their softmax steps, then the
/// tile's values, each phase's data small enough to stay in the first-level cache; in the
/// first phase up to [`GROUP`] queries share each vector of keys loaded, in the last up to
/// [`VALUE_GROUP`] each vector of values (ggml's `simd_gemm` blocking), each query's chain
/// of fused multiply-adds kept.
///
/// # Safety
/// The CPU has `L`'s instructions ([`Lanes`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn step_lanes<L: Lanes>(qs: &[&[f32]], tile: Tile<'_>, states: &mut [State]) {
    // SAFETY: the CPU has L's instructions (the caller's contract); every load and store
    // below is of whole vectors inside a tile's 64 scores or weights, a tile's key rows
    // (64 each, one per dimension of the queries) or a padded value row and accumulator
    // (multiples of 16).
    unsafe {
        let n = qs.len();
        let mut scores = [[0f32; TILE]; BLOCK];
        let keys = tile.keys().as_ptr();
        let mut i = 0;
        while i < n {
            let group = (n - i).min(GROUP);
            let (q, out) = (&qs[i..i + group], &mut scores[i..i + group]);
            match group {
                6 => scores_group::<L, 6>(q, keys, out),
                5 => scores_group::<L, 5>(q, keys, out),
                4 => scores_group::<L, 4>(q, keys, out),
                3 => scores_group::<L, 3>(q, keys, out),
                2 => scores_group::<L, 2>(q, keys, out),
                _ => scores_group::<L, 1>(q, keys, out),
            }
            i += group;
        }
        let mut weights = [[0f32; TILE]; BLOCK];
        for ((s, state), w) in scores.iter_mut().zip(states.iter_mut()).zip(&mut weights) {
            s.iter_mut().for_each(|v| *v *= tile.scale);
            s[..tile.lo].fill(f32::NEG_INFINITY);
            s[tile.hi..].fill(f32::NEG_INFINITY);
            let acc = state.acc.as_mut_ptr();
            *w = softmax_step::<L, true>(&mut state.part, s, acc, state.acc.len());
        }
        let (cells, values, p) = (tile.cells(), tile.values().as_ptr(), tile.kv.padded());
        let mut i = 0;
        while i < n {
            let group = (n - i).min(VALUE_GROUP);
            let (st, w) = (&mut states[i..i + group], &weights[i..i + group]);
            match group {
                4 => values_group::<L, 4>(st, w, values, p, cells),
                3 => values_group::<L, 3>(st, w, values, p, cells),
                2 => values_group::<L, 2>(st, w, values, p, cells),
                _ => values_group::<L, 1>(st, w, values, p, cells),
            }
            i += group;
        }
    }
}

/// Queries that share each vector of keys loaded: with two vectors of keys, twelve
/// accumulators, AVX2's sixteen registers' worth with the loads.
const GROUP: usize = 6;
/// Queries that share each vector of values loaded: with three vectors of values, twelve
/// accumulators (a 72-wide head in three passes, not four and a half).
const VALUE_GROUP: usize = 4;

/// The unscaled scores of `R` queries against a tile's keys (`keys`: one row of 64 per
/// dimension), into `out`: each score one chain of fused multiply-adds over the
/// dimensions in order, two vectors of keys at a time shared by the `R` queries.
///
/// # Safety
/// The CPU has `L`'s instructions ([`Lanes`]); `keys` holds `q[0].len()` rows of 64; `q`
/// and `out` have `R` entries, each query as long as the first.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scores_group<L: Lanes, const R: usize>(
    q: &[&[f32]],
    keys: *const f32,
    out: &mut [[f32; TILE]],
) {
    // SAFETY: the caller upholds this function's contract; loads are inside `keys`' rows
    // of 64 (two vectors at `c` of `TILE / L::WIDTH`, an even count) and stores inside
    // `out`'s rows.
    unsafe {
        let dims = q[0].len();
        let vectors = TILE / L::WIDTH;
        let mut c = 0;
        while c < vectors {
            let mut acc = [[L::zero(); 2]; R];
            for d in 0..dims {
                let row = keys.add(d * TILE + c * L::WIDTH);
                let (k0, k1) = (L::load(row), L::load(row.add(L::WIDTH)));
                for (a, q) in acc.iter_mut().zip(q) {
                    let qv = L::splat(*q.get_unchecked(d));
                    a[0] = L::fmadd(k0, qv, a[0]);
                    a[1] = L::fmadd(k1, qv, a[1]);
                }
            }
            for (a, o) in acc.iter().zip(out.iter_mut()) {
                L::store(o.as_mut_ptr().add(c * L::WIDTH), a[0]);
                L::store(o.as_mut_ptr().add((c + 1) * L::WIDTH), a[1]);
            }
            c += 2;
        }
    }
}

/// `R` queries' accumulators (`states`), each plus its weights (`weights`, the first
/// `cells`) times the tile's value rows (`values`, `stride` apart), in key order: passes
/// of up to three vectors of a row, each vector of values loaded shared by the `R`
/// queries (twelve accumulators for four).
///
/// # Safety
/// The CPU has `L`'s instructions ([`Lanes`]); `values` holds `cells` rows of `stride`
/// readable values; every accumulator has `stride` values; `stride` is a multiple of
/// `L::WIDTH`; `states` and `weights` have `R` entries.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn values_group<L: Lanes, const R: usize>(
    states: &mut [State],
    weights: &[[f32; TILE]],
    values: *const f32,
    stride: usize,
    cells: usize,
) {
    // SAFETY: the caller upholds this function's contract; each pass's vectors lie below
    // `stride`, as `values_pass` needs.
    unsafe {
        let accs: [*mut f32; R] = std::array::from_fn(|i| states[i].acc.as_mut_ptr());
        let vectors = stride / L::WIDTH;
        let mut v = 0;
        while v < vectors {
            let at = v * L::WIDTH;
            match vectors - v {
                1 => values_pass::<L, R, 1>(accs, weights, values.add(at), stride, cells, at),
                2 => values_pass::<L, R, 2>(accs, weights, values.add(at), stride, cells, at),
                _ => values_pass::<L, R, 3>(accs, weights, values.add(at), stride, cells, at),
            }
            v += 3;
        }
    }
}

/// One pass of [`values_group`]: `V` vectors from `at` of each accumulator.
///
/// # Safety
/// As [`values_group`]; `values` points at the pass's first value of the tile's first
/// row, and the pass's `V` vectors lie inside every row and accumulator.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn values_pass<L: Lanes, const R: usize, const V: usize>(
    accs: [*mut f32; R],
    weights: &[[f32; TILE]],
    values: *const f32,
    stride: usize,
    cells: usize,
    at: usize,
) {
    // SAFETY: the caller upholds this function's contract: every load and store is of a
    // whole vector of the pass, inside a value row or an accumulator.
    unsafe {
        let mut acc: [[L::V; V]; R] = std::array::from_fn(|i| {
            std::array::from_fn(|k| L::load(accs[i].add(at + k * L::WIDTH)))
        });
        for j in 0..cells {
            let row = values.add(j * stride);
            let v: [L::V; V] = std::array::from_fn(|k| L::load(row.add(k * L::WIDTH)));
            for (a, w) in acc.iter_mut().zip(weights) {
                let wv = L::splat(*w.get_unchecked(j));
                for (a, v) in a.iter_mut().zip(&v) {
                    *a = L::fmadd(*v, wv, *a);
                }
            }
        }
        for (a, &p) in acc.iter().zip(&accs) {
            for (k, a) in a.iter().enumerate() {
                L::store(p.add(at + k * L::WIDTH), *a);
            }
        }
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
        // SigLIP's heads (72: three passes of three vectors with AVX2), Qwen2.5-VL's (80:
        // a last pass of one) and 64-wide ones (a last pass of two); patches that leave
        // every size of group of queries last in a block.
        for (head_dim, n) in [(72, 150), (80, 151), (64, 149)] {
            check_vector_versions(head_dim, n);
        }
    }

    fn check_vector_versions(head_dim: usize, n: usize) {
        let heads = 3;
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
                assert!(same, "{name} over {keys:?}, heads of {head_dim}");
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
