//! Causal attention against a sequence's paged f16 KV cache, with the numerics of
//! llama.cpp's CPU flash attention. llama.cpp has three ways to attend and picks one by
//! the shape of the work, so a row's result depends on how llama-server batched it; each
//! row here carries the [`AttentionKernel`] llama.cpp would use for it:
//!
//! - [`AttentionKernel::Row`] (`one_chunk` in ggml): one query row at a time, the query
//!   rounded to f16, key dot products accumulated in f32 over 4 × 16 lanes, values summed
//!   in f16 with an online softmax. Micro-batches of fewer than 64 rows.
//! - [`AttentionKernel::Tiled`] (`attention_tiled.rs`): 64-key tiles, the query kept in f32,
//!   values summed in f32, the softmax's sum in f64 per tile. Micro-batches of 64 rows or
//!   more.
//! - [`AttentionKernel::Split`]: a row alone over 512 cells or more is attended as two
//!   halves by the row kernel (one per thread in llama.cpp), and the halves combined.
//!
//! The models are sensitive enough to these roundings that matching them is what makes
//! greedy output agree with llama.cpp beyond the first few dozen tokens. The AVX2 and
//! AVX-512 versions (`attention_simd.rs`, `attention_tiled_simd.rs`) give bit-identical
//! results faster.

use half::f16;

pub use super::attention_parts::ScoreScale;
use super::attention_parts::{dot_f16, normalise, KvRows, Partial};
use super::attention_quant::{attend_tokens, Heads, TokenRows};
use super::attention_tiled::{self, Query, TiledKernel};
use crate::kv_cache::LayerView;
use crate::simd::softmax::online_step;

/// The geometry of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_kv_head: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// Factor applied to query·key.
    pub scale: f32,
    /// Sliding window: a query at position p sees keys at positions > p - window.
    pub window: Option<usize>,
    /// Soft cap of the scores (Gemma 2): `cap · tanh(score / cap)`.
    pub softcap: Option<f32>,
}

impl AttentionShape {
    /// How a query·key dot product becomes a score for this shape.
    pub fn score_scale(&self) -> ScoreScale {
        match self.softcap {
            // ggml divides the scale by the cap first, then multiplies tanh's result back.
            Some(cap) => ScoreScale {
                factor: self.scale / cap,
                cap,
            },
            None => ScoreScale {
                factor: self.scale,
                cap: 0.0,
            },
        }
    }
}

/// Which of llama.cpp's flash-attention kernels a query row's rounding follows (see the
/// module's documentation). Chosen by [`super::PromptBatching`] from the row's micro-batch
/// and position, never from what else ferrite happens to batch with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    /// One row at a time, f16 query and accumulator.
    Row,
    /// 64-key tiles, f32 query and accumulator.
    Tiled,
    /// The row kernel over each half of `cells` KV cells, then the halves combined.
    Split {
        /// The cells llama.cpp attends over: the used ones padded to a multiple of 256.
        cells: usize,
    },
}

impl AttentionKernel {
    /// Query rows in a micro-batch from which llama.cpp takes the tiled kernel.
    pub const TILED_FROM_ROWS: usize = 64;
    /// KV cells from which llama.cpp splits a lone row's work between two threads.
    pub const SPLIT_FROM_CELLS: usize = 512;
    /// llama.cpp attends over the used cells padded to a multiple of this.
    pub const CELL_PADDING: usize = 256;

    /// The kernel of a row at `pos` in a micro-batch of `rows` rows.
    pub fn for_micro_batch(rows: usize, pos: usize) -> Self {
        if rows >= Self::TILED_FROM_ROWS {
            return Self::Tiled;
        }
        let cells = (pos + 1)
            .next_multiple_of(Self::CELL_PADDING)
            .max(Self::CELL_PADDING);
        if rows == 1 && cells >= Self::SPLIT_FROM_CELLS {
            Self::Split { cells }
        } else {
            Self::Row
        }
    }
}

/// The new rows of one sequence: their queries, and the cache they attend to, whose last
/// `n` positions are theirs.
#[derive(Clone, Copy)]
pub struct AttentionInput<'a> {
    /// `n × n_head × head_dim` queries.
    pub q: &'a [f32],
    /// The sequence's keys and values for this layer, the new rows' included.
    pub kv: LayerView<'a>,
    /// New rows.
    pub n: usize,
    /// The kernel of each new row.
    pub kernels: &'a [AttentionKernel],
    /// Positions whose rows see each other both ways (an image's): a row there sees
    /// every key up to its span's end, not only up to itself.
    pub bidirectional: &'a [std::ops::Range<usize>],
}

/// Combines the halves of a split row as ggml's `reduce_partials` does (each half's
/// values rescaled to the larger maximum with `expf`, added with one fused multiply-add
/// per value, then normalised) into `out`.
fn combine(halves: [(Partial, &[f32]); 2], out: &mut [f32]) {
    out.fill(0.0);
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
    for (part, acc) in halves {
        if part.sum == 0.0 {
            continue;
        }
        let new_max = max.max(part.max);
        let (old, new) = ((max - new_max).exp(), (part.max - new_max).exp());
        for (o, a) in out.iter_mut().zip(acc) {
            *o = o.mul_add(old, a * new);
        }
        sum = sum.mul_add(old, part.sum * new);
        max = new_max;
    }
    normalise(out, sum);
}

/// The row kernel for the query rows of one group of heads sharing a KV head (`q` holds
/// them one after another, `head_dim` each), with the given scale: each row's weighted
/// values go to `acc` (unnormalised) and its maximum and sum to `partials`.
pub(super) type GroupKernel = unsafe fn(
    q: &[f32],
    kv: &KvRows<'_>,
    head_dim: usize,
    scale: ScoreScale,
    acc: &mut [f32],
    partials: &mut [Partial],
);

/// The kernels one attention pass runs with.
#[derive(Clone, Copy)]
struct Kernels {
    row: GroupKernel,
    tiled: TiledKernel,
    /// Whether a task's row-kernel rows go through the cache together
    /// ([`super::attention_quant::attend_tokens`], for a quantized cache) rather than
    /// each token's in turn.
    tokens_together: bool,
}

/// Tiled rows of one sequence and KV head handled by one task (they share each tile's
/// keys and values, converted once).
const TILED_TASK_ROWS: usize = 64;

/// Row-kernel rows of one sequence and KV head handled by one task (a prompt's rows with
/// a quantized cache: a task each cost about as much as their attention at 2k tokens).
const ROW_TASK_ROWS: usize = 16;

/// Causal attention of the new rows of several sequences (in order; each one's keys and
/// values already written to its cache). Returns every row's `n_head × head_dim` output,
/// in input order. Query rows are independent and all run in one parallel pass.
pub fn attend_many(shape: &AttentionShape, inputs: &[AttentionInput<'_>]) -> Vec<f32> {
    if inputs.iter().any(|input| !input.kv.types().is_f16()) {
        return attend_quantized(shape, inputs);
    }
    #[cfg(target_arch = "x86_64")]
    if shape.head_dim.is_multiple_of(64) && crate::simd::avx2() {
        let kernels = Kernels {
            row: super::attention_simd::attend_rows,
            tiled: super::attention_tiled_simd::attend_tiled,
            tokens_together: false,
        };
        // SAFETY: AVX2, FMA and F16C are available and the head size is a multiple of 64.
        return unsafe { attend_with(shape, inputs, kernels) };
    }
    attend_portable_many(shape, inputs)
}

/// Attention over quantized caches: llama.cpp takes its row kernel for every row of
/// them (`attention_quant.rs`), whatever kernel the row's batch would choose for f16.
fn attend_quantized(shape: &AttentionShape, inputs: &[AttentionInput<'_>]) -> Vec<f32> {
    let rows: Vec<Vec<AttentionKernel>> = inputs
        .iter()
        .map(|input| vec![AttentionKernel::Row; input.n])
        .collect();
    let inputs: Vec<AttentionInput<'_>> = inputs
        .iter()
        .zip(&rows)
        .map(|(input, kernels)| AttentionInput { kernels, ..*input })
        .collect();
    let kernels = Kernels {
        row: super::attention_quant::attend_rows,
        tiled: attention_tiled::attend_tiled_portable,
        tokens_together: true,
    };
    // SAFETY: the quantized row kernel has no requirements, and no row is tiled.
    unsafe { attend_with(shape, &inputs, kernels) }
}

/// [`attend_many`] for one sequence.
pub fn attend(shape: &AttentionShape, input: AttentionInput<'_>) -> Vec<f32> {
    attend_many(shape, &[input])
}

/// [`attend`] in portable code.
pub fn attend_portable(shape: &AttentionShape, input: AttentionInput<'_>) -> Vec<f32> {
    attend_portable_many(shape, &[input])
}

fn attend_portable_many(shape: &AttentionShape, inputs: &[AttentionInput<'_>]) -> Vec<f32> {
    let kernels = Kernels {
        row: attend_rows_portable,
        tiled: attention_tiled::attend_tiled_portable,
        tokens_together: false,
    };
    // SAFETY: the portable kernels have no requirements.
    unsafe { attend_with(shape, inputs, kernels) }
}

/// [`GroupKernel`] in portable code.
///
/// # Safety
///
/// None: it is portable code, `unsafe` only to share [`GroupKernel`]'s type.
unsafe fn attend_rows_portable(
    q: &[f32],
    kv: &KvRows<'_>,
    head_dim: usize,
    scale: ScoreScale,
    acc: &mut [f32],
    partials: &mut [Partial],
) {
    let rows = q.chunks_exact(head_dim).zip(acc.chunks_exact_mut(head_dim));
    for ((q, acc), partial) in rows.zip(partials) {
        *partial = attend_row(q, kv, scale, acc);
    }
}

/// Some rows of one sequence attending with one KV head's keys and values, with one
/// kernel.
struct Task {
    input: usize,
    kv_head: usize,
    /// The rows, numbered within the input.
    rows: std::ops::Range<usize>,
    /// The first row's number among all inputs' rows.
    first_row: usize,
}

/// Attention with `kernels` for every row and KV head, in one parallel pass.
///
/// # Safety
/// The kernels' requirements must hold for `shape`.
unsafe fn attend_with(
    shape: &AttentionShape,
    inputs: &[AttentionInput<'_>],
    kernels: Kernels,
) -> Vec<f32> {
    let AttentionShape {
        n_head,
        n_kv_head,
        head_dim,
        ..
    } = *shape;
    let group = n_head / n_kv_head;
    let mut tasks = Vec::new();
    let mut first_row = 0;
    for (i, input) in inputs.iter().enumerate() {
        assert!(
            input.kv.kv_width() == n_kv_head * head_dim
                && input.kv.positions() >= input.n
                && input.q.len() >= input.n * n_head * head_dim
                && input.kernels.len() == input.n
        );
        for kv_head in 0..n_kv_head {
            let mut t = 0;
            while t < input.n {
                // Rows of one kernel share a task (split rows go alone): a tile's keys
                // are converted once for its rows, and short rows do not each pay for a
                // task of their own.
                let kernel = input.kernels[t];
                let most = match kernel {
                    AttentionKernel::Tiled => TILED_TASK_ROWS,
                    AttentionKernel::Row => ROW_TASK_ROWS,
                    AttentionKernel::Split { .. } => 1,
                };
                let mut end = t + 1;
                while end < input.n && end - t < most && input.kernels[end] == kernel {
                    end += 1;
                }
                tasks.push(Task {
                    input: i,
                    kv_head,
                    rows: t..end,
                    first_row: first_row + t,
                });
                t = end;
            }
        }
        first_row += input.n;
    }
    let slots: Vec<std::sync::OnceLock<Vec<f32>>> =
        tasks.iter().map(|_| std::sync::OnceLock::new()).collect();
    crate::threads::for_each_index(tasks.len(), |i| {
        let task = &tasks[i];
        // SAFETY: the caller guarantees the kernels' requirements.
        let result = unsafe { run_task(shape, &inputs[task.input], task, kernels) };
        slots[i].set(result).expect("each task runs once");
    });
    let results: Vec<Vec<f32>> = slots
        .into_iter()
        .map(|slot| slot.into_inner().expect("every task ran"))
        .collect();
    let width = n_head * head_dim;
    let group_width = group * head_dim;
    let mut out = vec![0.0f32; first_row * width];
    for (task, result) in tasks.iter().zip(&results) {
        for (k, chunk) in result.chunks_exact(group_width).enumerate() {
            let at = (task.first_row + k) * width + task.kv_head * group_width;
            out[at..at + group_width].copy_from_slice(chunk);
        }
    }
    out
}

/// One task's output: its rows' `group × head_dim` values, one row after another.
///
/// # Safety
/// The kernels' requirements must hold for `shape`.
unsafe fn run_task(
    shape: &AttentionShape,
    input: &AttentionInput<'_>,
    task: &Task,
    kernels: Kernels,
) -> Vec<f32> {
    let AttentionShape {
        n_head,
        n_kv_head,
        head_dim,
        window,
        ..
    } = *shape;
    let scale = shape.score_scale();
    let group = n_head / n_kv_head;
    let offset = task.kv_head * head_dim;
    let position = |t: usize| input.kv.positions() - input.n + t;
    let first = |pos: usize| window.map_or(0, |w| (pos + 1).saturating_sub(w));
    // The last key a row sees: itself, or the end of its bidirectional span (whose later
    // keys no window hides: llama.cpp masks only keys too far behind).
    let last = |pos: usize| {
        input
            .bidirectional
            .iter()
            .find(|span| span.contains(&pos))
            .map_or(pos, |span| span.end - 1)
    };
    let queries =
        |t: usize| &input.q[(t * n_head + task.kv_head * group) * head_dim..][..group * head_dim];
    let mut out = vec![0.0f32; task.rows.len() * group * head_dim];
    let t = task.rows.start;
    let pos = position(t);
    // The row kernel for row `t` over positions `lo..=hi` (none when empty): the group's
    // unnormalised values into `acc` (zeros on entry) and its partials.
    let attend_range = |t: usize, lo: usize, hi: usize, acc: &mut [f32]| {
        let mut partials = vec![Partial::EMPTY; group];
        if lo <= hi {
            let kv = KvRows {
                view: input.kv,
                offset,
                first: lo,
                last: hi,
            };
            // SAFETY: the caller guarantees the row kernel's requirements.
            unsafe { (kernels.row)(queries(t), &kv, head_dim, scale, acc, &mut partials) };
        }
        partials
    };
    match input.kernels[t] {
        AttentionKernel::Tiled => {
            let rows: Vec<Query<'_>> = task
                .rows
                .clone()
                .flat_map(|t| {
                    let pos = position(t);
                    queries(t).chunks_exact(head_dim).map(move |q| Query {
                        q,
                        first: first(pos),
                        last: last(pos),
                    })
                })
                .collect();
            // SAFETY: the caller guarantees the tiled kernel's requirements.
            unsafe { (kernels.tiled)(&rows, input.kv, offset, scale, &mut out) };
        }
        AttentionKernel::Row if kernels.tokens_together => {
            let tokens: Vec<TokenRows<'_>> = task
                .rows
                .clone()
                .map(|t| TokenRows {
                    q: queries(t),
                    first: first(position(t)),
                    last: last(position(t)),
                })
                .collect();
            let heads = Heads {
                view: input.kv,
                offset,
                head_dim,
            };
            let mut partials = vec![Partial::EMPTY; tokens.len() * group];
            attend_tokens(&tokens, heads, scale, &mut out, &mut partials);
            for (o, p) in out.chunks_exact_mut(head_dim).zip(&partials) {
                normalise(o, p.sum);
            }
        }
        AttentionKernel::Row => {
            let width = group * head_dim;
            for (t, out) in task.rows.clone().zip(out.chunks_exact_mut(width)) {
                let pos = position(t);
                let partials = attend_range(t, first(pos), last(pos), out);
                for (o, p) in out.chunks_exact_mut(head_dim).zip(&partials) {
                    normalise(o, p.sum);
                }
            }
        }
        AttentionKernel::Split { cells } => {
            // The second half always reaches the row's own position.
            let half = cells.div_ceil(2);
            let bounds = [(0, half), (half, cells.max(last(pos) + 1))];
            let halves = bounds.map(|(start, end)| {
                let mut acc = vec![0.0f32; group * head_dim];
                let partials =
                    attend_range(t, first(pos).max(start), last(pos).min(end - 1), &mut acc);
                (acc, partials)
            });
            for (h, o) in out.chunks_exact_mut(head_dim).enumerate() {
                let part = |k: usize| (halves[k].1[h], &halves[k].0[h * head_dim..][..head_dim]);
                combine([part(0), part(1)], o);
            }
        }
    }
    out
}

/// One query row in portable code: its unnormalised weighted values in `acc`.
fn attend_row(q: &[f32], kv: &KvRows<'_>, scale: ScoreScale, acc: &mut [f32]) -> Partial {
    let head_dim = q.len();
    let stride = kv.view.kv_width();
    let q16: Vec<f16> = q.iter().map(|&x| f16::from_f32(x)).collect();
    let mut acc16 = vec![f16::ZERO; head_dim];
    let mut max = f32::NEG_INFINITY;
    let mut sum = 0.0f32;
    for (keys, values, len) in kv.runs() {
        for j in 0..len {
            let at = j * stride + kv.offset;
            let s = scale.apply(dot_f16(&q16, &keys[at..at + head_dim]));
            let (rescale, weight, raised) = online_step(s, &mut max);
            if raised {
                for a in acc16.iter_mut() {
                    *a = f16::from_f32(a.to_f32() * rescale);
                }
            }
            for (a, v) in acc16.iter_mut().zip(&values[at..at + head_dim]) {
                *a = f16::from_f32(v.to_f32().mul_add(weight, a.to_f32()));
            }
            sum = sum.mul_add(rescale, weight);
        }
    }
    for (o, a) in acc.iter_mut().zip(&acc16) {
        *o = a.to_f32();
    }
    Partial { max, sum }
}

#[cfg(test)]
mod tests;
