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
//!
//! Each row's arithmetic is llama.cpp's for that row alone, but the rows of several
//! tokens go through the cache together ([`attend_tokens`]): a run of keys whose every
//! position all of them see is scored and added for all of them at once, its value heads
//! converted once and still in the cache for the next token. A prompt's tokens each
//! attending alone read the whole cache once per token (Gemma 3's one KV head: 2.2 MB per
//! token at 4k).

use half::f16;

use super::attention_parts::{ask_for_head, dot_f16, KvRows, Partial, ScoreScale};
use crate::kv_cache::{KvType, LayerView, BLOCK_POSITIONS};
use crate::quant::kv::KvQuery;
use crate::simd::softmax::{add_to_sums, KeySteps};

/// The query row as the keys' dot product takes it.
enum Query {
    /// Rounded to f16, for f16 keys.
    F16(Vec<f16>),
    /// Quantized to Q8_0, for quantized keys.
    Q8(KvQuery),
}

/// One token's query rows (its group of heads sharing a KV head, `head_dim` each) and the
/// positions they attend to, `first..=last` (none when `first > last`).
pub(super) struct TokenRows<'a> {
    pub(super) q: &'a [f32],
    pub(super) first: usize,
    pub(super) last: usize,
}

/// The row kernel ([`super::attention::GroupKernel`]) for a cache with a quantized key or
/// value type: one token's rows ([`attend_tokens`] for one token).
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
    let token = TokenRows {
        q,
        first: kv.first,
        last: kv.last,
    };
    let heads = Heads {
        view: kv.view,
        offset: kv.offset,
        head_dim,
    };
    attend_tokens(&[token], heads, scale, acc, partials);
}

/// Where one KV head lies in a layer's cache.
#[derive(Clone, Copy)]
pub(super) struct Heads<'a> {
    pub(super) view: LayerView<'a>,
    /// Where the head starts within a position (in values).
    pub(super) offset: usize,
    pub(super) head_dim: usize,
}

/// Every row of `tokens` (each with as many rows, one KV head) attending to its
/// positions: unnormalised values to `acc` (the rows one after another), maximum and sum
/// to `partials`. Bit for bit each row attending alone.
pub(super) fn attend_tokens(
    tokens: &[TokenRows<'_>],
    heads: Heads<'_>,
    scale: ScoreScale,
    acc: &mut [f32],
    partials: &mut [Partial],
) {
    let Heads { view, head_dim, .. } = heads;
    let types = view.types();
    let group = tokens.first().map_or(0, |t| t.q.len() / head_dim);
    let queries: Vec<Query> = tokens
        .iter()
        .flat_map(|t| t.q.chunks_exact(head_dim))
        .map(|q| match types.keys {
            KvType::F16 => Query::F16(q.iter().map(|&x| f16::from_f32(x)).collect()),
            _ => Query::Q8(KvQuery::new(q)),
        })
        .collect();
    let rows = queries.len();
    let mut state = RowState {
        acc: &mut acc[..rows * head_dim],
        max: vec![f32::NEG_INFINITY; rows],
        sum: vec![0.0; rows],
        steps: (0..rows).map(|_| KeySteps::EMPTY).collect(),
    };
    state.acc.fill(0.0);
    let seen = tokens.iter().filter(|t| t.first <= t.last);
    let (lo, hi) = (
        seen.clone().map(|t| t.first).min(),
        seen.map(|t| t.last).max(),
    );
    if let (Some(lo), Some(hi)) = (lo, hi) {
        let mut runs = view.runs(lo..hi + 1).peekable();
        while let Some(run) = runs.next() {
            if let Some(next) = runs.peek() {
                heads.ask_for(next.clone());
            }
            // Tokens that see the whole run go together (consecutive ones, in turn);
            // one that sees part of it goes alone over that part.
            let mut t = 0;
            while t < tokens.len() {
                let (from, to) = tokens[t].window(&run);
                if from >= to {
                    t += 1;
                    continue;
                }
                let mut end = t + 1;
                if (from, to) == (run.start, run.end) {
                    while end < tokens.len() && tokens[end].window(&run) == (from, to) {
                        end += 1;
                    }
                }
                let span = Span {
                    rows: t * group..end * group,
                    positions: from..to,
                };
                state.attend(&queries, heads, scale, span);
                t = end;
            }
        }
    }
    for ((partial, max), sum) in partials.iter_mut().zip(state.max).zip(state.sum) {
        *partial = Partial { max, sum };
    }
}

impl TokenRows<'_> {
    /// The positions of `run` this token sees (empty when `from >= to`).
    fn window(&self, run: &std::ops::Range<usize>) -> (usize, usize) {
        (run.start.max(self.first), run.end.min(self.last + 1))
    }
}

/// Where the head lies in one part's stored rows (its keys or its values, in the part's
/// type), in bytes.
struct Part {
    /// A position's row: every KV head.
    row: usize,
    /// The head's start within a row.
    at: usize,
    /// The head's length.
    head: usize,
}

impl Heads<'_> {
    /// Where the head lies in rows stored in type `t`.
    fn part(&self, t: KvType) -> Part {
        Part {
            row: t.row_bytes(self.view.kv_width()),
            at: t.row_bytes(self.offset),
            head: t.row_bytes(self.head_dim),
        }
    }

    /// Asks for this head's keys and values at `positions` ([`ask_for_head`]).
    fn ask_for(&self, positions: std::ops::Range<usize>) {
        let types = self.view.types();
        let len = positions.len();
        let keys = self.view.key_bytes(positions.clone());
        let values = self.view.value_bytes(positions);
        for (t, run) in [(types.keys, keys), (types.values, values)] {
            let part = self.part(t);
            ask_for_head(run, len, part.row, part.at, part.head);
        }
    }
}

/// Rows that attend to the same block-contiguous positions.
struct Span {
    rows: std::ops::Range<usize>,
    positions: std::ops::Range<usize>,
}

/// Every row's accumulator, running maximum and sum, and the steps of the keys at hand.
struct RowState<'a> {
    acc: &'a mut [f32],
    max: Vec<f32>,
    sum: Vec<f32>,
    steps: Vec<KeySteps>,
}

impl RowState<'_> {
    /// The span's rows take its positions: each row's scores and softmax steps, then the
    /// values for all of them together.
    fn attend(&mut self, queries: &[Query], heads: Heads<'_>, scale: ScoreScale, span: Span) {
        let Heads { view, head_dim, .. } = heads;
        let types = view.types();
        let (k, v) = (heads.part(types.keys), heads.part(types.values));
        let keys = view.key_bytes(span.positions.clone());
        let values = view.value_bytes(span.positions.clone());
        let len = span.positions.len();
        debug_assert!(len <= BLOCK_POSITIONS);
        let mut scores = [0f32; BLOCK_POSITIONS];
        let scores = &mut scores[..len];
        for r in span.rows.clone() {
            match &queries[r] {
                Query::F16(q16) => {
                    for (j, s) in scores.iter_mut().enumerate() {
                        let at = j * k.row + k.at;
                        *s = dot_f16(q16, bytemuck::cast_slice(&keys[at..at + k.head]));
                    }
                }
                Query::Q8(query) => types.keys.key_dots(&keys[k.at..], k.row, query, scores),
            }
            self.steps[r].fill_scaled(&scale.scaled_block(scores), len, &mut self.max[r]);
        }
        let rows = span.rows.clone();
        add_to_sums(&mut self.sum[rows.clone()], &self.steps[rows.clone()], len);
        types.values.add_values(
            &values[v.at..],
            v.row,
            len,
            &self.steps[rows.clone()],
            &mut self.acc[rows.start * head_dim..rows.end * head_dim],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::{KvTypes, SequenceCache};
    use crate::quant::sample::Xorshift;

    /// Tokens attending together give each row's bits attending alone, whatever their
    /// windows: all of the cache, a causal diagonal ending mid-block, sliding windows
    /// starting mid-block, windows that see nothing, and ones reaching past the token
    /// (an image's rows), for every type and a group of three rows.
    #[test]
    fn tokens_together_are_each_alone() {
        let mut rng = Xorshift::new(11);
        let (head_dim, kv_heads, group, positions) = (64, 2, 3, 300);
        let width = kv_heads * head_dim;
        let kinds = [KvType::Q8_0, KvType::Q4_0, KvType::F16];
        for keys in kinds {
            for values in kinds {
                let types = KvTypes { keys, values };
                if types.is_f16() {
                    continue;
                }
                let mut cache = SequenceCache::with_types(1, width, positions, types);
                let kv: Vec<f32> = (0..2 * positions * width)
                    .map(|_| rng.next_f32() * 4.0 - 2.0)
                    .collect();
                let (k, v) = kv.split_at(positions * width);
                cache.write(0, k, v);
                cache.commit(positions);
                let view = cache.layer(0, positions);
                let q: Vec<f32> = (0..40 * group * head_dim)
                    .map(|_| rng.next_f32() * 2.0 - 1.0)
                    .collect();
                let windows: Vec<(usize, usize)> = (0..40)
                    .map(|t| match t % 5 {
                        0 | 1 => (0, 250 + t),
                        2 => (100 + 7 * t, 250 + t),
                        3 => (200, 150),
                        _ => (64, 299),
                    })
                    .collect();
                let tokens: Vec<TokenRows<'_>> = windows
                    .iter()
                    .zip(q.chunks_exact(group * head_dim))
                    .map(|(&(first, last), q)| TokenRows { q, first, last })
                    .collect();
                let scale = crate::model::attention::AttentionShape {
                    n_head: group,
                    n_kv_head: 1,
                    head_dim,
                    scale: 0.125,
                    window: None,
                    softcap: None,
                }
                .score_scale();
                let heads = Heads {
                    view,
                    offset: head_dim,
                    head_dim,
                };
                let mut together = vec![0f32; q.len()];
                let mut partials = vec![Partial::EMPTY; 40 * group];
                attend_tokens(&tokens, heads, scale, &mut together, &mut partials);
                for (t, token) in tokens.iter().enumerate() {
                    let kv = KvRows {
                        view,
                        offset: head_dim,
                        first: token.first,
                        last: token.last,
                    };
                    let mut alone = vec![0f32; group * head_dim];
                    let mut alone_partials = vec![Partial::EMPTY; group];
                    if token.first <= token.last {
                        // SAFETY: the row kernel has no requirements.
                        unsafe {
                            attend_rows(
                                token.q,
                                &kv,
                                head_dim,
                                scale,
                                &mut alone,
                                &mut alone_partials,
                            )
                        };
                    }
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    let span = t * group * head_dim..(t + 1) * group * head_dim;
                    assert_eq!(bits(&together[span]), bits(&alone), "{types:?} token {t}");
                    assert_eq!(
                        &partials[t * group..(t + 1) * group],
                        &alone_partials[..],
                        "{types:?} token {t}"
                    );
                }
            }
        }
    }
}
