//! The `phi3` architecture: Phi-3 and Phi-3.5. What differs from the shared decoder: one
//! fused query-key-value matrix and one fused gate-up matrix (gate first), queries scaled
//! before attention, NeoX rotary embeddings with LongRoPE: per-frequency factors, the
//! `short` set for contexts up to the original training length and the `long` set beyond,
//! and every cosine and sine multiplied by the file's attention factor. llama.cpp turns
//! Phi-3's sliding window off, and so does ferrite.

use super::attention::AttentionShape;
use super::decoder::{
    Activation, AttentionBlock, Block, ContextRopes, Decoder, FeedForward, GateUp, Hyper,
    QkvProjection,
};
use super::ops::{Rope, RopeStyle};
use crate::error::EngineError;
use crate::gguf::GgufFile;

/// Loads a `phi3` model.
pub(super) fn load(gguf: &mut GgufFile) -> Result<Decoder, EngineError> {
    let hyper = Hyper::read(gguf, "phi3", 10_000.0, 4096, None)?;
    let dims = hyper.dims;
    let (head_dim, hidden) = (dims.head_dim, dims.hidden);
    let (q_width, kv_width) = (hyper.q_width(), hyper.kv_width());
    let m = &gguf.meta;
    let original = m
        .u32("phi3.rope.scaling.original_context_length")
        .map_or(dims.context_length, |v| v as usize);
    let magnitude = m.f32("phi3.rope.scaling.attn_factor").unwrap_or(1.0);
    let rope = |gguf: &mut GgufFile, factors: &str| -> Result<Rope, EngineError> {
        let factors = if gguf.has_tensor(factors) {
            Some(gguf.vector_of(factors, head_dim / 2)?)
        } else {
            None
        };
        Ok(Rope::new(
            head_dim,
            hyper.rope_theta,
            hyper.rope_scale,
            RopeStyle::Neox,
        )
        .with_freq_factors(factors)
        .with_magnitude(magnitude))
    };
    let ropes = ContextRopes {
        original,
        short: rope(gguf, "rope_factors_short.weight")?,
        long: rope(gguf, "rope_factors_long.weight")?,
    };
    let shape = AttentionShape {
        n_head: dims.n_head,
        n_kv_head: dims.n_kv_head,
        head_dim,
        scale: 1.0,
        window: None,
        softcap: None,
    };
    let mut blocks = Vec::with_capacity(dims.n_layers);
    for i in 0..dims.n_layers {
        let p = |n: &str| format!("blk.{i}.{n}.weight");
        let qkv = if gguf.has_tensor(&p("attn_qkv")) {
            QkvProjection::Fused(gguf.matmul_shaped(
                &p("attn_qkv"),
                q_width + 2 * kv_width,
                hidden,
            )?)
        } else {
            QkvProjection::Separate {
                q: gguf.matmul_shaped(&p("attn_q"), q_width, hidden)?,
                k: gguf.matmul_shaped(&p("attn_k"), kv_width, hidden)?,
                v: gguf.matmul_shaped(&p("attn_v"), kv_width, hidden)?,
            }
        };
        // The fused matrix holds the gate's rows and the up projection's.
        let ff = hyper.feed_forward_width(gguf, &p("ffn_up"), 2)?;
        blocks.push(Block {
            attn_norm: gguf.vector_of(&p("attn_norm"), hidden)?,
            attention: AttentionBlock {
                qkv,
                qkv_bias: None,
                qk_norm: None,
                output: gguf.matmul_shaped(&p("attn_output"), hidden, q_width)?,
                shape,
                rope: ropes.for_context(dims.context_length).clone(),
                query_scale: 1.0 / (head_dim as f32).sqrt(),
            },
            post_attn_norm: None,
            ffn_norm: gguf.vector_of(&p("ffn_norm"), hidden)?,
            ffn: FeedForward {
                gate_up: GateUp::Fused(gguf.matmul_shaped(&p("ffn_up"), 2 * ff, hidden)?),
                down: gguf.matmul_shaped(&p("ffn_down"), hidden, ff)?,
                activation: Activation::Silu,
            },
            post_ffn_norm: None,
        });
    }
    let mut model = Decoder::new(gguf, "phi3", &hyper, blocks)?;
    model.context_ropes = Some(ropes);
    Ok(model)
}
