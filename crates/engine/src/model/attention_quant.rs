//! The row kernel for a quantized KV cache: llama.cpp's `one_chunk` flash attention with
//! Q8_0 or Q4_0 keys or values (its `--cache-type-k` / `--cache-type-v`), which it runs for
//! every row of such a cache, whatever the batch or the context (its tiled and split
//! kernels take f16 caches only).
//!
//! Per query row: with quantized keys the query is quantized to Q8_0 and each score is the
//! formats' integer dot product (with f16 keys, as the f16 row kernel: the query rounded
//! to f16, [`dot_f16`]); the online softmax's steps are the f16 kernels' ([`KeySteps`], a
//! vector of keys at a time); with quantized values the weighted values are summed in f32
//! (with f16 values, in an f16 accumulator). The type-specific work, and its AVX2 twin, is
//! `quant/kv.rs`'s.

use half::f16;

use super::attention_parts::{ask_for_head, dot_f16, KvRows, Partial, ScoreScale};
use crate::kv_cache::{KvType, BLOCK_POSITIONS};
use crate::quant::kv::KvQuery;
use crate::simd::softmax::{add_to_sums, KeySteps};

/// The query row as the keys' dot product takes it.
enum Query {
    /// Rounded to f16, for f16 keys.
    F16(Vec<f16>),
    /// Quantized to Q8_0, for quantized keys.
    Q8(KvQuery),
}

/// The row kernel ([`super::attention::GroupKernel`]) for a cache with a quantized key or
/// value type: each query row of the group (`head_dim` each in `q`) attends to its KV
/// head, unnormalised values to `acc`, maximum and sum to `partials`.
///
/// # Safety
/// None: the type-specific parts check the CPU themselves; `unsafe` only to share
/// [`super::attention::GroupKernel`]'s type.
pub(super) unsafe fn attend_rows(
    q: &[f32],
    kv: &KvRows<'_>,
    head_dim: usize,
    scale: ScoreScale,
    acc: &mut [f32],
    partials: &mut [Partial],
) {
    let types = kv.view.types();
    let width = kv.view.kv_width();
    let (key_row, value_row) = (types.keys.row_bytes(width), types.values.row_bytes(width));
    // Where this KV head starts within a stored row.
    let (key_at, value_at) = (
        types.keys.row_bytes(kv.offset),
        types.values.row_bytes(kv.offset),
    );
    let key_head = types.keys.row_bytes(head_dim);
    let queries: Vec<Query> = q
        .chunks_exact(head_dim)
        .map(|q| match types.keys {
            KvType::F16 => Query::F16(q.iter().map(|&x| f16::from_f32(x)).collect()),
            _ => Query::Q8(KvQuery::new(q)),
        })
        .collect();
    let rows = queries.len();
    let acc = &mut acc[..rows * head_dim];
    acc.fill(0.0);
    let mut max = vec![f32::NEG_INFINITY; rows];
    let mut sum = vec![0.0f32; rows];
    let mut steps: Vec<KeySteps> = (0..rows).map(|_| KeySteps::EMPTY).collect();
    let mut scores = [0f32; BLOCK_POSITIONS];
    let value_head = types.values.row_bytes(head_dim);
    let mut runs = kv.byte_runs().peekable();
    while let Some((keys, values, len)) = runs.next() {
        if let Some(&(keys, values, len)) = runs.peek() {
            ask_for_head(keys, len, key_row, key_at, key_head);
            ask_for_head(values, len, value_row, value_at, value_head);
        }
        // Each row's scores and softmax steps for the run's keys, then its values for all.
        for ((query, steps), max) in queries.iter().zip(&mut steps).zip(&mut max) {
            let scores = &mut scores[..len];
            match query {
                Query::F16(q16) => {
                    for (j, s) in scores.iter_mut().enumerate() {
                        let at = j * key_row + key_at;
                        *s = dot_f16(q16, bytemuck::cast_slice(&keys[at..at + key_head]));
                    }
                }
                Query::Q8(query) => types.keys.key_dots(&keys[key_at..], key_row, query, scores),
            }
            steps.fill_scaled(&scale.scaled_block(scores), len, max);
        }
        add_to_sums(&mut sum, &steps, len);
        types
            .values
            .add_values(&values[value_at..], value_row, len, &steps, acc);
    }
    for ((partial, max), sum) in partials.iter_mut().zip(max).zip(sum) {
        *partial = Partial { max, sum };
    }
}
