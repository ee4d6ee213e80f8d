//! Attention for one group of query heads sharing a KV head, in AVX2 (eight lanes) or
//! AVX-512 (sixteen lanes), bit-identical to the portable [`super::attention`] row code.
//!
//! Per KV cache block, every row's scores come first (independent dot products, each key
//! converted once per pair of rows), then the online softmax's bookkeeping in scalar
//! code, then the values, added into accumulators held in registers across the block
//! (each value converted once per four rows). The accumulators stay f32 holding f16
//! values: rounding to f16 and back after every step is what storing to llama.cpp's f16
//! accumulator and loading it again does.

#![cfg(target_arch = "x86_64")]

use half::f16;

use super::attention::{KvRows, Partial, ScoreScale};
use crate::quant::simd::ask_for_lines;

/// Keys scored before their values are added: one KV cache block's positions.
const KEYS: usize = crate::kv_cache::BLOCK_POSITIONS;

/// Query rows whose accumulators are updated together.
const ROW_TILE: usize = 4;

use super::lanes::{Avx2, Avx512, Lanes};

/// Whether [`attend_rows`] may use AVX-512 (the CPU has it, `FERRITE_CPU` allows it).
pub(super) fn avx512_available() -> bool {
    crate::cpu::features().avx512
}

/// The row kernel ([`super::attention::GroupKernel`]) for the query rows of one group of
/// heads sharing a KV head, each bit-identical to [`super::attention`]'s portable row
/// code, with AVX-512 where the CPU has it.
///
/// # Safety
/// AVX2, FMA and F16C must be available; the head size is a multiple of 64.
pub unsafe fn attend_rows(
    q: &[f32],
    kv: &KvRows<'_>,
    head_dim: usize,
    scale: ScoreScale,
    acc: &mut [f32],
    partials: &mut [Partial],
) {
    if avx512_available() {
        attend_avx512(q, kv, head_dim, scale, acc, partials)
    } else {
        attend_avx2(q, kv, head_dim, scale, acc, partials)
    }
}

/// [`attend_rows`] with AVX-512.
///
/// # Safety
/// As for [`attend_rows`], and AVX-512F must be available.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn attend_avx512(
    q: &[f32],
    kv: &KvRows<'_>,
    head_dim: usize,
    scale: ScoreScale,
    acc: &mut [f32],
    partials: &mut [Partial],
) {
    attend_body::<Avx512>(q, kv, head_dim, scale, acc, partials)
}

/// [`attend_rows`] with AVX2 alone.
///
/// # Safety
/// As for [`attend_rows`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_avx2(
    q: &[f32],
    kv: &KvRows<'_>,
    head_dim: usize,
    scale: ScoreScale,
    acc: &mut [f32],
    partials: &mut [Partial],
) {
    attend_body::<Avx2>(q, kv, head_dim, scale, acc, partials)
}

/// The dot products of `R` query rows (f32 holding f16 values, `head_dim` apart) with
/// one f16 key, each summed as ggml's AVX-512 `ggml_vec_dot_f16` (four accumulators of
/// 16 lanes over steps of 64). The key is converted once for the `R` rows.
#[inline(always)]
unsafe fn dots<L: Lanes, const R: usize>(
    q: *const f32,
    head_dim: usize,
    key: *const f16,
) -> [f32; R] {
    // Sized for the narrowest width; `64 / WIDTH` of them are used.
    let mut acc = [[L::zero(); 8]; R];
    let per_step = 64 / L::WIDTH;
    for step in (0..head_dim).step_by(64) {
        for (i, at) in (step..step + 64).step_by(L::WIDTH).enumerate() {
            let k = L::load_f16(key.add(at));
            for (r, acc) in acc.iter_mut().enumerate() {
                acc[i] = L::fmadd(L::load(q.add(r * head_dim + at)), k, acc[i]);
            }
        }
    }
    acc.map(|a| L::reduce64(&a[..per_step]))
}

/// One key's step of a query row's online softmax.
#[derive(Clone, Copy)]
struct Step {
    /// The dot product of query and key.
    score: f32,
    /// Whether the key raises the maximum, rescaling the accumulator.
    raised: bool,
    /// The factor the accumulator is rescaled by (when raised).
    rescale: f32,
    /// The weight of the key's value.
    weight: f32,
}

/// One query row's steps over a KV block.
type Steps = [Step; KEYS];

/// Adds `len` keys' values (`stride` apart from `values`) into `R` rows' accumulators
/// (`head_dim` apart from `acc`), in key order with an f16 rounding after every step.
/// Each value is converted once for the `R` rows.
// The key index addresses the cache as well as the steps.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn add_values<L: Lanes, const R: usize>(
    acc: *mut f32,
    head_dim: usize,
    values: *const f16,
    stride: usize,
    len: usize,
    steps: &[Steps],
) {
    let steps: &[Steps; R] = steps[..R].try_into().unwrap();
    let n = L::VALUE_VECTORS;
    for d in (0..head_dim).step_by(n * L::WIDTH) {
        // Sized for the widest choice; `VALUE_VECTORS` of them are used.
        let mut a = [[L::zero(); 4]; R];
        for (r, a) in a.iter_mut().enumerate() {
            for (h, a) in a.iter_mut().take(n).enumerate() {
                *a = L::load(acc.add(r * head_dim + d + h * L::WIDTH));
            }
        }
        for j in 0..len {
            let at = values.add(j * stride + d);
            let mut v = [L::zero(); 4];
            for (h, v) in v.iter_mut().take(n).enumerate() {
                *v = L::load_f16(at.add(h * L::WIDTH));
            }
            for r in 0..R {
                let step = steps[r][j];
                if step.raised {
                    let s = L::splat(step.rescale);
                    for a in a[r].iter_mut().take(n) {
                        *a = L::round16(L::mul(*a, s));
                    }
                }
                let w = L::splat(step.weight);
                for (a, v) in a[r].iter_mut().zip(&v).take(n) {
                    *a = L::round16(L::fmadd(*v, w, *a));
                }
            }
        }
        for (r, a) in a.iter().enumerate() {
            for (h, a) in a.iter().take(n).enumerate() {
                L::store(acc.add(r * head_dim + d + h * L::WIDTH), *a);
            }
        }
    }
}

/// Asks for one KV head's keys and values at the `len` positions of a run (`stride`
/// elements apart, the head `offset` elements into each), into the second-level cache:
/// every line a head's `head_dim` values touch, wherever the block's allocation put them
/// against line boundaries.
///
/// A position holds every KV head, so one head's values are a few of a position's lines
/// (Llama 3.2 1B: 128 of 1,024 bytes). The hardware's prefetchers did not follow that
/// pattern: at a 1,000-token context, a 1B model's decode step spent a fifth of its time
/// in attention, most of it waiting on key and value loads. The kernel asks for the next
/// run while it scores and adds this one (a run takes microseconds).
#[inline(always)]
fn ask_for_head(
    keys: &[f16],
    values: &[f16],
    len: usize,
    stride: usize,
    offset: usize,
    head_dim: usize,
) {
    let bytes = head_dim * std::mem::size_of::<f16>();
    for run in [keys, values] {
        let mut at = run.as_ptr().wrapping_add(offset);
        for _ in 0..len {
            ask_for_lines(at, bytes);
            at = at.wrapping_add(stride);
        }
    }
}

// The key index addresses the cache as well as the steps.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn attend_body<L: Lanes>(
    q: &[f32],
    kv: &KvRows<'_>,
    head_dim: usize,
    scale: ScoreScale,
    acc: &mut [f32],
    partials: &mut [Partial],
) {
    let rows = q.len() / head_dim;
    assert!(
        acc.len() == q.len()
            && partials.len() == rows
            && rows * head_dim == q.len()
            && head_dim.is_multiple_of(64)
    );
    // The queries rounded to f16, held as f32.
    let mut q16 = vec![0f32; q.len()];
    for i in (0..q.len()).step_by(L::WIDTH) {
        L::store(
            q16.as_mut_ptr().add(i),
            L::round16(L::load(q.as_ptr().add(i))),
        );
    }
    acc.fill(0.0);
    let mut max = vec![f32::NEG_INFINITY; rows];
    let mut sum = vec![0.0f32; rows];
    let step = Step {
        score: 0.0,
        raised: false,
        rescale: 1.0,
        weight: 0.0,
    };
    let mut steps: Vec<Steps> = vec![[step; KEYS]; rows];
    let stride = kv.view.kv_width();
    let q16 = q16.as_ptr();
    let mut runs = kv.runs().peekable();
    while let Some((keys, values, len)) = runs.next() {
        assert!(len <= KEYS && len * stride <= keys.len() && kv.offset + head_dim <= stride);
        if let Some(&(keys, values, len)) = runs.peek() {
            ask_for_head(keys, values, len, stride, kv.offset, head_dim);
        }
        for j in 0..len {
            let key = keys.as_ptr().add(j * stride + kv.offset);
            let mut g = 0;
            while g + 2 <= rows {
                let [a, b] = dots::<L, 2>(q16.add(g * head_dim), head_dim, key);
                (steps[g][j].score, steps[g + 1][j].score) = (a, b);
                g += 2;
            }
            if g < rows {
                steps[g][j].score = dots::<L, 1>(q16.add(g * head_dim), head_dim, key)[0];
            }
        }
        for ((steps, max), sum) in steps.iter_mut().zip(&mut max).zip(&mut sum) {
            for step in &mut steps[..len] {
                let s = scale.apply(step.score);
                step.raised = s > *max;
                (step.rescale, step.weight) = if step.raised {
                    let rescale = (*max - s).exp();
                    *max = s;
                    (rescale, 1.0)
                } else {
                    (1.0, (s - *max).exp())
                };
                *sum = sum.mul_add(step.rescale, step.weight);
            }
        }
        let v = values.as_ptr().add(kv.offset);
        for g in (0..rows).step_by(ROW_TILE) {
            let a = acc.as_mut_ptr().add(g * head_dim);
            let st = &steps[g..];
            match rows - g {
                1 => add_values::<L, 1>(a, head_dim, v, stride, len, st),
                2 => add_values::<L, 2>(a, head_dim, v, stride, len, st),
                3 => add_values::<L, 3>(a, head_dim, v, stride, len, st),
                _ => add_values::<L, ROW_TILE>(a, head_dim, v, stride, len, st),
            }
        }
    }
    for ((partial, max), sum) in partials.iter_mut().zip(max).zip(sum) {
        *partial = Partial { max, sum };
    }
}
