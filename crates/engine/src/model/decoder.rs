//! The decoder every architecture shares: token embedding, a stack of pre-norm blocks
//! (attention, then a gated feed-forward, each added to the residual stream), a final norm
//! and the output matrix. An architecture file reads its hyper-parameters and tensors and
//! fills in the options here: what it does differently is data, not a copy of this loop.

use super::attention::AttentionShape;
use super::ops::{self, Rope, RopeStyle};
use super::{
    attend_batch, gather_rows, BatchEntry, Dimensions, Model, ModelInfo, PromptBatching, StepLayout,
};
use crate::error::EngineError;
use crate::gguf::GgufFile;
use crate::kv_cache::KvTypes;
use crate::quant::{Embedding, QMatrix, RowKernel};

/// The hyper-parameters every architecture has, read from `<arch>.*` metadata keys.
#[derive(Debug, Clone, Copy)]
pub(super) struct Hyper {
    /// The checked dimensions.
    pub dims: Dimensions,
    /// RMS norm epsilon.
    pub eps: f32,
    /// Rotary base frequency.
    pub rope_theta: f32,
    /// Linear RoPE scaling factor (1 for none).
    pub rope_scale: f32,
    /// Vocabulary size (the embedding's rows).
    pub vocab_size: usize,
    /// The feed-forward width `feed_forward_length` says, when the file says one: the
    /// feed-forward matrices must have it (as llama.cpp requires).
    pub feed_forward: Option<usize>,
}

impl Hyper {
    /// Reads `<arch>.*`; `head_dim` and `rope_theta` default as the architecture says when
    /// the file leaves them out, and `context_length` to `default_context`.
    pub fn read(
        gguf: &GgufFile,
        arch: &str,
        default_theta: f32,
        default_context: usize,
        default_head_dim: Option<usize>,
    ) -> Result<Self, EngineError> {
        let m = &gguf.meta;
        let key = |k: &str| format!("{arch}.{k}");
        let hidden = m.u32(&key("embedding_length"))? as usize;
        let n_head = m.u32(&key("attention.head_count"))? as usize;
        let head_dim = m
            .u32(&key("attention.key_length"))
            .or_else(|_| m.u32(&key("rope.dimension_count")))
            .map(|v| v as usize)
            .unwrap_or(default_head_dim.unwrap_or(hidden / n_head.max(1)));
        let dims = Dimensions {
            hidden,
            n_layers: m.u32(&key("block_count"))? as usize,
            n_head,
            n_kv_head: m
                .u32(&key("attention.head_count_kv"))
                .map_or(n_head, |v| v as usize),
            head_dim,
            context_length: m
                .u32(&key("context_length"))
                .map_or(default_context, |v| v as usize),
        }
        .check(gguf)?;
        Ok(Self {
            dims,
            eps: m.f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta: m.f32(&key("rope.freq_base")).unwrap_or(default_theta),
            rope_scale: m.f32(&key("rope.scaling.factor")).unwrap_or(1.0),
            vocab_size: dims.vocab_size(gguf)?,
            feed_forward: m.u32(&key("feed_forward_length")).ok().map(|v| v as usize),
        })
    }

    /// A block's feed-forward width: the metadata's, else what its matrix `name` has
    /// (`ffn_gate`; or a fused gate-up `ffn_up`, whose rows are `per_row` times the width).
    /// The block's matrices are then loaded checked against it.
    pub fn feed_forward_width(
        &self,
        gguf: &GgufFile,
        name: &str,
        per_row: usize,
    ) -> Result<usize, EngineError> {
        match self.feed_forward {
            Some(width) => Ok(width),
            None => Ok(gguf.dims(name)?.first().copied().unwrap_or(0) / per_row),
        }
    }

    /// The attention most architectures have: every layer global, query·key scaled by
    /// 1/√head_dim inside the kernel, no soft cap.
    pub fn plain_shape(&self) -> AttentionShape {
        AttentionShape {
            n_head: self.dims.n_head,
            n_kv_head: self.dims.n_kv_head,
            head_dim: self.dims.head_dim,
            scale: 1.0 / (self.dims.head_dim as f32).sqrt(),
            window: None,
            softcap: None,
        }
    }

    /// A rotary embedding with the file's base frequency and linear scaling.
    pub fn rope(&self, style: RopeStyle) -> Rope {
        Rope::new(self.dims.head_dim, self.rope_theta, self.rope_scale, style)
    }

    /// Width of all query heads together.
    pub fn q_width(&self) -> usize {
        self.dims.n_head * self.dims.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_width(&self) -> usize {
        self.dims.n_kv_head * self.dims.head_dim
    }
}

/// How a block computes its queries, keys and values.
pub(super) enum QkvProjection {
    /// Three matrices.
    Separate {
        /// Query projection.
        q: QMatrix,
        /// Key projection.
        k: QMatrix,
        /// Value projection.
        v: QMatrix,
    },
    /// One matrix whose output rows are the query, key and value rows in turn (Phi-3).
    Fused(QMatrix),
}

/// A block's attention.
pub(super) struct AttentionBlock {
    /// The projections.
    pub qkv: QkvProjection,
    /// Biases added to the query, key and value (Qwen 2).
    pub qkv_bias: Option<[Vec<f32>; 3]>,
    /// RMS norms of each query and key head, before RoPE (Qwen 3, Gemma 3).
    pub qk_norm: Option<[Vec<f32>; 2]>,
    /// The output projection.
    pub output: QMatrix,
    /// Heads, scale and window.
    pub shape: AttentionShape,
    /// Rotary embedding.
    pub rope: Rope,
    /// Factor the queries are multiplied by after RoPE, as its own rounding (Gemma); 1.0
    /// when the scale is applied inside attention instead.
    pub query_scale: f32,
}

/// How a block's feed-forward gates.
pub(super) enum Activation {
    /// `silu(gate) · up`.
    Silu,
    /// `gelu_tanh(gate) · up`.
    GeluTanh,
}

/// How a block computes the feed-forward's gate and up projections.
pub(super) enum GateUp {
    /// Two matrices.
    Separate {
        /// Gate projection.
        gate: QMatrix,
        /// Up projection.
        up: QMatrix,
    },
    /// One matrix whose output rows are the gate rows, then the up rows (Phi-3).
    Fused(QMatrix),
}

/// A block's feed-forward.
pub(super) struct FeedForward {
    /// Gate and up projections.
    pub gate_up: GateUp,
    /// Down projection.
    pub down: QMatrix,
    /// The gating activation.
    pub activation: Activation,
}

/// One transformer block.
pub(super) struct Block {
    /// Norm before attention.
    pub attn_norm: Vec<f32>,
    /// Attention.
    pub attention: AttentionBlock,
    /// Norm of attention's output before the residual add (Gemma).
    pub post_attn_norm: Option<Vec<f32>>,
    /// Norm before the feed-forward.
    pub ffn_norm: Vec<f32>,
    /// Feed-forward.
    pub ffn: FeedForward,
    /// Norm of the feed-forward's output before the residual add (Gemma).
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// Rotary embeddings that depend on the context length served (Phi-3's LongRoPE): the
/// `short` one up to the `original` training context, the `long` one beyond, chosen as
/// llama.cpp chooses them from its per-sequence context.
pub(super) struct ContextRopes {
    /// The original (pre-extension) training context.
    pub original: usize,
    /// For contexts up to `original`.
    pub short: Rope,
    /// For longer contexts.
    pub long: Rope,
}

impl ContextRopes {
    /// The embedding for a context of `context` positions.
    pub fn for_context(&self, context: usize) -> &Rope {
        if context > self.original {
            &self.long
        } else {
            &self.short
        }
    }
}

/// A decoder-only transformer: the model every architecture builds.
pub(super) struct Decoder {
    /// Facts for the engine.
    pub info: ModelInfo,
    /// Token embedding.
    pub embedding: Embedding,
    /// Factor the embedding is multiplied by (Gemma's √hidden); 1.0 for none.
    pub embedding_scale: f32,
    /// The blocks.
    pub blocks: Vec<Block>,
    /// Final norm.
    pub output_norm: Vec<f32>,
    /// Output matrix (the embedding, when tied).
    pub output: QMatrix,
    /// Embedding width.
    pub hidden: usize,
    /// RMS norm epsilon.
    pub eps: f32,
    /// How prompt rows are rounded.
    pub batching: PromptBatching,
    /// Soft cap of the logits (Gemma 2): `cap · tanh(logit / cap)`.
    pub final_softcap: Option<f32>,
    /// Rotary embeddings chosen by the context length served, if they are (Phi-3).
    pub context_ropes: Option<ContextRopes>,
    /// The types new caches store keys and values in.
    pub kv_types: KvTypes,
}

impl Decoder {
    /// The parts every architecture loads the same way: the embedding, the final norm, the
    /// output matrix (or the embedding when the file ties them), and the engine's facts.
    pub fn new(
        gguf: &mut GgufFile,
        architecture: &str,
        hyper: &Hyper,
        blocks: Vec<Block>,
    ) -> Result<Self, EngineError> {
        let Hyper {
            dims, vocab_size, ..
        } = *hyper;
        let output = if gguf.has_tensor("output.weight") {
            gguf.matmul_shaped("output.weight", vocab_size, dims.hidden)?
        } else {
            gguf.matmul("token_embd.weight")?
        };
        let sliding_window = blocks.iter().any(|b| b.attention.shape.window.is_some());
        Ok(Self {
            info: ModelInfo {
                architecture: architecture.into(),
                name: gguf.meta.string("general.name").ok(),
                n_layers: dims.n_layers,
                hidden: dims.hidden,
                kv_width: hyper.kv_width(),
                vocab_size,
                context_length: dims.context_length,
                sliding_window,
                rounds_by_kernel: gguf.rounds_by_kernel(),
                grid_positions: blocks.iter().any(|b| b.attention.rope.has_sections()),
            },
            embedding: gguf.embedding("token_embd.weight")?,
            embedding_scale: 1.0,
            blocks,
            output_norm: gguf.vector_of("output_norm.weight", dims.hidden)?,
            output,
            hidden: dims.hidden,
            eps: hyper.eps,
            batching: PromptBatching::default(),
            final_softcap: None,
            context_ropes: None,
            kv_types: KvTypes::F16,
        })
    }
}

/// Reads block `i`'s tensors named as llama.cpp names them: separate Q/K/V and gate/up
/// matrices, no biases or extra norms (architectures add those to the result).
pub(super) fn plain_block(
    gguf: &mut GgufFile,
    i: usize,
    hyper: &Hyper,
    shape: AttentionShape,
    rope: Rope,
    activation: Activation,
) -> Result<Block, EngineError> {
    let hidden = hyper.dims.hidden;
    let (q_width, kv_width) = (hyper.q_width(), hyper.kv_width());
    let p = |n: &str| format!("blk.{i}.{n}.weight");
    let ff = hyper.feed_forward_width(gguf, &p("ffn_gate"), 1)?;
    Ok(Block {
        attn_norm: gguf.vector_of(&p("attn_norm"), hidden)?,
        attention: AttentionBlock {
            qkv: QkvProjection::Separate {
                q: gguf.matmul_shaped(&p("attn_q"), q_width, hidden)?,
                k: gguf.matmul_shaped(&p("attn_k"), kv_width, hidden)?,
                v: gguf.matmul_shaped(&p("attn_v"), kv_width, hidden)?,
            },
            qkv_bias: None,
            qk_norm: None,
            output: gguf.matmul_shaped(&p("attn_output"), hidden, q_width)?,
            shape,
            rope,
            query_scale: 1.0,
        },
        post_attn_norm: None,
        ffn_norm: gguf.vector_of(&p("ffn_norm"), hidden)?,
        ffn: FeedForward {
            gate_up: GateUp::Separate {
                gate: gguf.matmul_shaped(&p("ffn_gate"), ff, hidden)?,
                up: gguf.matmul_shaped(&p("ffn_up"), ff, hidden)?,
            },
            down: gguf.matmul_shaped(&p("ffn_down"), hidden, ff)?,
            activation,
        },
        post_ffn_norm: None,
    })
}

/// Splits each row of `x` (`widths` summed wide) into one buffer per width.
fn split_columns<const N: usize>(x: &[f32], widths: [usize; N]) -> [Vec<f32>; N] {
    let row: usize = widths.iter().sum();
    let rows = x.len() / row.max(1);
    let mut out: [Vec<f32>; N] = std::array::from_fn(|i| Vec::with_capacity(rows * widths[i]));
    for r in x.chunks_exact(row) {
        let mut at = 0;
        for (buf, &w) in out.iter_mut().zip(&widths) {
            buf.extend_from_slice(&r[at..at + w]);
            at += w;
        }
    }
    out
}

/// Adds `bias` to every row of `x`.
fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        ops::add_assign(row, bias);
    }
}

impl AttentionBlock {
    /// Queries, keys and values of the rows of `h`, biased, normed and rotated.
    fn project(
        &self,
        h: &[f32],
        kernels: &[RowKernel],
        positions: &[[usize; 4]],
        eps: f32,
    ) -> Result<[Vec<f32>; 3], EngineError> {
        let q_width = self.shape.n_head * self.shape.head_dim;
        let kv_width = self.shape.n_kv_head * self.shape.head_dim;
        let [mut q, mut k, mut v] = match &self.qkv {
            QkvProjection::Separate { q, k, v } => ops::matmul_many([q, k, v], h, kernels)?,
            QkvProjection::Fused(w) => {
                split_columns(&ops::matmul(w, h, kernels)?, [q_width, kv_width, kv_width])
            }
        };
        if let Some([bq, bk, bv]) = &self.qkv_bias {
            add_bias(&mut q, bq);
            add_bias(&mut k, bk);
            add_bias(&mut v, bv);
        }
        if let Some([q_norm, k_norm]) = &self.qk_norm {
            ops::rms_norm(&mut q, q_norm, eps);
            ops::rms_norm(&mut k, k_norm, eps);
        }
        for (r, &pos) in positions.iter().enumerate() {
            self.rope
                .apply_at(&mut q[r * q_width..(r + 1) * q_width], pos);
            self.rope
                .apply_at(&mut k[r * kv_width..(r + 1) * kv_width], pos);
        }
        if self.query_scale != 1.0 {
            q.iter_mut().for_each(|v| *v *= self.query_scale);
        }
        Ok([q, k, v])
    }
}

impl FeedForward {
    /// The feed-forward of the rows of `h`.
    fn apply(&self, h: &[f32], kernels: &[RowKernel]) -> Result<Vec<f32>, EngineError> {
        let (mut gate, up) = match &self.gate_up {
            GateUp::Separate { gate, up } => {
                let [g, u] = ops::matmul_many([gate, up], h, kernels)?;
                (g, u)
            }
            GateUp::Fused(w) => {
                let width = w.rows() / 2;
                let [g, u] = split_columns(&ops::matmul(w, h, kernels)?, [width, width]);
                (g, u)
            }
        };
        match self.activation {
            Activation::Silu => ops::silu_mul(&mut gate, &up),
            Activation::GeluTanh => ops::gelu_mul(&mut gate, &up),
        }
        ops::matmul(&self.down, &gate, kernels)
    }
}

impl Model for Decoder {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn forward(&self, batch: &mut [BatchEntry<'_>]) -> Result<Vec<Vec<f32>>, EngineError> {
        let layout = StepLayout::new(batch, &self.batching, self.info.sliding_window);
        if layout.rows() == 0 {
            return Ok(Vec::new());
        }
        let mut x = layout.input_rows(batch, &self.embedding, self.embedding_scale, self.hidden)?;
        let all = &layout.kernels;
        let mut ffn_kernels = all.clone();
        for (li, block) in self.blocks.iter().enumerate() {
            let attention = &block.attention;
            let mut h = x.clone();
            ops::rms_norm(&mut h, &block.attn_norm, self.eps);
            let [q, k, v] = attention.project(&h, all, &layout.rope_positions, self.eps)?;
            let attn = attend_batch(&attention.shape, li, &layout, [q, k, v], batch);
            let mut o = ops::matmul(&attention.output, &attn, all)?;
            if let Some(norm) = &block.post_attn_norm {
                ops::rms_norm(&mut o, norm, self.eps);
            }
            ops::add_assign(&mut x, &o);
            if li + 1 == self.blocks.len() {
                // Only the rows whose logits are wanted need the last feed-forward.
                x = gather_rows(&x, self.hidden, &layout.logit_rows);
                ffn_kernels = layout.logit_kernels.clone();
                if ffn_kernels.is_empty() {
                    break;
                }
            }
            let mut h = x.clone();
            ops::rms_norm(&mut h, &block.ffn_norm, self.eps);
            let mut down = block.ffn.apply(&h, &ffn_kernels)?;
            if let Some(norm) = &block.post_ffn_norm {
                ops::rms_norm(&mut down, norm, self.eps);
            }
            ops::add_assign(&mut x, &down);
        }
        for entry in batch.iter_mut() {
            entry.cache.commit(entry.tokens.len());
        }
        if layout.logit_rows.is_empty() {
            return Ok(Vec::new());
        }
        ops::rms_norm(&mut x, &self.output_norm, self.eps);
        let mut logits = ops::matmul_rows(&self.output, &x, &layout.logit_kernels)?;
        if let Some(cap) = self.final_softcap {
            // Three roundings, as ggml's scale, tanh and scale.
            let inverse = 1.0 / cap;
            logits
                .iter_mut()
                .flatten()
                .for_each(|l| *l = (*l * inverse).tanh() * cap);
        }
        Ok(logits)
    }

    fn set_context_length(&mut self, context: usize) {
        if let Some(ropes) = &self.context_ropes {
            let rope = ropes.for_context(context);
            for block in &mut self.blocks {
                block.attention.rope = rope.clone();
            }
        }
    }

    fn set_prompt_batching(&mut self, batching: PromptBatching) {
        self.batching = batching;
    }

    fn prompt_batching(&self) -> PromptBatching {
        self.batching
    }

    fn set_kv_types(&mut self, types: KvTypes) -> Result<(), EngineError> {
        for block in &self.blocks {
            let head_dim = block.attention.shape.head_dim;
            for (what, t) in [("keys", types.keys), ("values", types.values)] {
                if !t.fits(head_dim) {
                    return Err(EngineError::Unsupported(format!(
                        "a {t} KV cache for {what}: this model's heads have {head_dim} values, and {t} stores blocks of 32 (use f16)"
                    )));
                }
            }
        }
        self.kv_types = types;
        Ok(())
    }

    fn kv_types(&self) -> KvTypes {
        self.kv_types
    }
}
