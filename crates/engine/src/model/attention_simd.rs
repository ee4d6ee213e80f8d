//! Attention for one group of query heads sharing a KV head, in AVX2 (eight lanes) or
//! AVX-512 (sixteen lanes), bit-identical to the portable [`super::attention`] row code.
//!
//! Per KV cache block, every row's scores come first (independent dot products, each key
//! converted once per pass of up to four rows with AVX-512 (three for a group of three,
//! SmolLM2's) and two with AVX2, eight keys' sums finished together), then the online
//! softmax's steps a vector of keys at a time (only the sums' chains are scalar), then the
//! values, added into accumulators held in registers across the block
//! (each value converted once per four rows). The accumulators stay f32 holding f16
//! values: rounding to f16 and back after every step is what storing to llama.cpp's f16
//! accumulator and loading it again does.

#![cfg(target_arch = "x86_64")]

use half::f16;

use std::arch::x86_64::*;

use super::attention_parts::{ask_for_head, KvRows, Partial, ScoreScale};
use crate::simd::lanes::{hsum8_each, Avx2, Avx512, Lanes};
use crate::simd::softmax::{add_to_sums, KeySteps, STEP_KEYS};

/// Keys scored before their values are added: one KV cache block's positions.
const KEYS: usize = crate::kv_cache::BLOCK_POSITIONS;

// A block's keys take one [`KeySteps`].
const _: () = assert!(KEYS == STEP_KEYS);

/// Query rows whose accumulators are updated together.
const ROW_TILE: usize = 4;

/// Keys whose dot products are finished together ([`dots8`]).
const KEY_GROUP: usize = 8;

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
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        if crate::simd::avx512() {
            attend_avx512(q, kv, head_dim, scale, acc, partials)
        } else {
            attend_avx2(q, kv, head_dim, scale, acc, partials)
        }
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
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe { attend_body::<Avx512>(q, kv, head_dim, scale, acc, partials) }
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
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe { attend_body::<Avx2>(q, kv, head_dim, scale, acc, partials) }
}

/// ggml's four dot product accumulators (`64 / WIDTH` vectors each, sized for the
/// narrowest width) of `R` query rows (f32 holding f16 values, `head_dim` apart) with one
/// f16 key, as ggml's AVX-512 `ggml_vec_dot_f16` builds them over steps of 64. The key is
/// converted once for the `R` rows.
///
/// # Safety
/// As under [`attend_rows`]: the CPU has `L`'s instructions ([`Lanes`]) and the head size is a
/// multiple of 64; `q` reaches `R` rows of `head_dim` values, `key` `head_dim` values.
#[inline(always)]
unsafe fn dot_accumulators<L: Lanes, const R: usize>(
    q: *const f32,
    head_dim: usize,
    key: *const f16,
) -> [[L::V; 8]; R] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let mut acc = [[L::zero(); 8]; R];
        for step in (0..head_dim).step_by(64) {
            for (i, at) in (step..step + 64).step_by(L::WIDTH).enumerate() {
                let k = L::load_f16(key.add(at));
                for (r, acc) in acc.iter_mut().enumerate() {
                    acc[i] = L::fmadd(L::load(q.add(r * head_dim + at)), k, acc[i]);
                }
            }
        }
        acc
    }
}

/// The dot products of `R` query rows with one f16 key, each summed as ggml's
/// `ggml_vec_dot_f16` does ([`dot_accumulators`], then [`Lanes::reduce64`]).
///
/// # Safety
/// As for [`dot_accumulators`].
#[inline(always)]
unsafe fn dots<L: Lanes, const R: usize>(
    q: *const f32,
    head_dim: usize,
    key: *const f16,
) -> [f32; R] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let acc = dot_accumulators::<L, R>(q, head_dim, key);
        acc.map(|a| L::reduce64(&a[..64 / L::WIDTH]))
    }
}

/// [`dots`] of `R` query rows with eight keys, each row's eight sums finished together
/// ([`hsum8_each`]) rather than one chain of shuffles and additions each: the bits of
/// eight calls of [`dots`], in the order of `keys`.
///
/// # Safety
///
/// As under [`attend_rows`]: the CPU has `L`'s instructions ([`Lanes`]) and the head size is a
/// multiple of 64; `q` reaches `R` rows of `head_dim` values, each key `head_dim` values.
#[inline(always)]
unsafe fn dots8<L: Lanes, const R: usize>(
    q: *const f32,
    head_dim: usize,
    keys: [*const f16; KEY_GROUP],
) -> [__m256; R] {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let mut halves = [[_mm256_setzero_ps(); KEY_GROUP]; R];
        for (i, key) in keys.into_iter().enumerate() {
            let acc = dot_accumulators::<L, R>(q, head_dim, key);
            for (halves, acc) in halves.iter_mut().zip(&acc) {
                halves[i] = L::halves64(&acc[..64 / L::WIDTH]);
            }
        }
        halves.map(|h| hsum8_each(&h))
    }
}

/// Scores `R` query rows (`head_dim` apart from `q`) against the `len` keys from `key`
/// (`stride` apart) into `scores` (one row's per entry): eight keys at a time
/// ([`dots8`]), the rest one at a time.
///
/// # Safety
/// As under [`attend_rows`]: the CPU has `L`'s instructions ([`Lanes`]) and the head size is a
/// multiple of 64; `q` reaches `R` rows of `head_dim` values, `key` `len` keys `stride` apart,
/// and `scores` holds `R` rows.
#[inline(always)]
unsafe fn score_rows<L: Lanes, const R: usize>(
    q: *const f32,
    head_dim: usize,
    key: *const f16,
    stride: usize,
    len: usize,
    scores: &mut [[f32; KEYS]],
) {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let scores: &mut [[f32; KEYS]; R] = (&mut scores[..R]).try_into().unwrap();
        let grouped = len / KEY_GROUP * KEY_GROUP;
        for j in (0..grouped).step_by(KEY_GROUP) {
            let keys = std::array::from_fn(|i| key.add((j + i) * stride));
            let sums = dots8::<L, R>(q, head_dim, keys);
            for (scores, sums) in scores.iter_mut().zip(sums) {
                _mm256_storeu_ps(scores[j..j + KEY_GROUP].as_mut_ptr(), sums);
            }
        }
        for j in grouped..len {
            let sums = dots::<L, R>(q, head_dim, key.add(j * stride));
            for (scores, sum) in scores.iter_mut().zip(sums) {
                scores[j] = sum;
            }
        }
    }
}

/// Adds `len` keys' values (`stride` apart from `values`) into `R` rows' accumulators
/// (`head_dim` apart from `acc`), in key order with an f16 rounding after every step.
/// Each value is converted once for the `R` rows.
///
/// # Safety
/// As under [`attend_rows`]: the CPU has `L`'s instructions ([`Lanes`]) and the head size is a
/// multiple of 64; `acc` reaches `R` rows of `head_dim` writable values, `values` `len` values
/// `stride` apart, and `steps` holds `R` rows.
// The key index addresses the cache as well as the steps.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn add_values<L: Lanes, const R: usize>(
    acc: *mut f32,
    head_dim: usize,
    values: *const f16,
    stride: usize,
    len: usize,
    steps: &[KeySteps],
) {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let steps: &[KeySteps; R] = steps[..R].try_into().unwrap();
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
                    if steps[r].raised(j) {
                        let s = L::splat(steps[r].rescale[j]);
                        for a in a[r].iter_mut().take(n) {
                            *a = L::round16(L::mul(*a, s));
                        }
                    }
                    let w = L::splat(steps[r].weight[j]);
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
}

/// # Safety
/// As for [`attend_rows`], with `L`'s instructions ([`Lanes`]).
#[inline(always)]
unsafe fn attend_body<L: Lanes>(
    q: &[f32],
    kv: &KvRows<'_>,
    head_dim: usize,
    scale: ScoreScale,
    acc: &mut [f32],
    partials: &mut [Partial],
) {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
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
        let mut steps: Vec<KeySteps> = (0..rows).map(|_| KeySteps::EMPTY).collect();
        let mut scores: Vec<[f32; KEYS]> = vec![[0.0; KEYS]; rows];
        let stride = kv.view.kv_width();
        let q16 = q16.as_ptr();
        let mut runs = kv.runs().peekable();
        while let Some((keys, values, len)) = runs.next() {
            assert!(len <= KEYS && len * stride <= keys.len() && kv.offset + head_dim <= stride);
            if let Some(&(keys, values, len)) = runs.peek() {
                for part in [keys, values] {
                    ask_for_head(part, len, stride, kv.offset, head_dim);
                }
            }
            let key = keys.as_ptr().add(kv.offset);
            let mut g = 0;
            // Four rows' accumulators need sixteen-lane registers: AVX2's sixteen would
            // spill, and it scores two rows at a time.
            while L::WIDTH == 16 && g + 4 <= rows {
                let q = q16.add(g * head_dim);
                score_rows::<L, 4>(q, head_dim, key, stride, len, &mut scores[g..]);
                g += 4;
            }
            if L::WIDTH == 16 && rows - g == 3 {
                let q = q16.add(g * head_dim);
                score_rows::<L, 3>(q, head_dim, key, stride, len, &mut scores[g..]);
                g += 3;
            }
            while g + 2 <= rows {
                let q = q16.add(g * head_dim);
                score_rows::<L, 2>(q, head_dim, key, stride, len, &mut scores[g..]);
                g += 2;
            }
            if g < rows {
                let q = q16.add(g * head_dim);
                score_rows::<L, 1>(q, head_dim, key, stride, len, &mut scores[g..]);
            }
            for ((steps, scores), max) in steps.iter_mut().zip(&scores).zip(&mut max) {
                steps.fill::<L>(&scale.scaled_block(&scores[..len]), len, max);
            }
            add_to_sums(&mut sum, &steps, len);
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
}
