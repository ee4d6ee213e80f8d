//! The `gemma2` architecture: Gemma 2. What differs from the shared decoder: the embedding
//! scaled by √hidden, norms after attention and feed-forward too, queries scaled before
//! attention, attention scores and final logits soft-capped (`cap · tanh(x / cap)`), GELU
//! (tanh) gating, NeoX rotary embeddings, and a sliding window on every other layer (the
//! even ones). The output matrix is always the embedding.

use super::attention::AttentionShape;
use super::decoder::{plain_block, Activation, Decoder, Hyper};
use super::ops::{Rope, RopeStyle};
use crate::error::EngineError;
use crate::gguf::GgufFile;

/// Layer `i` attends within the window when `i % SLIDING_WINDOW_PATTERN` is not the last.
const SLIDING_WINDOW_PATTERN: usize = 2;
/// Gemma 2 27B's block count: its queries are scaled by 1/√(hidden / heads) instead.
const LAYERS_27B: usize = 46;

/// Loads a `gemma2` model.
pub(super) fn load(gguf: &mut GgufFile) -> Result<Decoder, EngineError> {
    let hyper = Hyper::read(gguf, "gemma2", 10_000.0, 8192, Some(256))?;
    let dims = hyper.dims;
    let (head_dim, hidden) = (dims.head_dim, dims.hidden);
    let m = &gguf.meta;
    let window = m
        .u32("gemma2.attention.sliding_window")
        .map_or(4096, |v| v as usize);
    let attn_cap = m.f32("gemma2.attn_logit_softcapping").unwrap_or(50.0);
    let final_cap = m.f32("gemma2.final_logit_softcapping").unwrap_or(30.0);
    let local_theta = m
        .f32("gemma2.rope.freq_base_swa")
        .unwrap_or(hyper.rope_theta);
    let global_rope = Rope::new(
        head_dim,
        hyper.rope_theta,
        hyper.rope_scale,
        RopeStyle::Neox,
    );
    let local_rope = Rope::new(head_dim, local_theta, hyper.rope_scale, RopeStyle::Neox);
    let query_scale = if dims.n_layers == LAYERS_27B {
        1.0 / ((hidden / dims.n_head) as f32).sqrt()
    } else {
        1.0 / (head_dim as f32).sqrt()
    };
    let mut blocks = Vec::with_capacity(dims.n_layers);
    for i in 0..dims.n_layers {
        let local = i % SLIDING_WINDOW_PATTERN < SLIDING_WINDOW_PATTERN - 1;
        let shape = AttentionShape {
            n_head: dims.n_head,
            n_kv_head: dims.n_kv_head,
            head_dim,
            // Queries are scaled before attention.
            scale: 1.0,
            window: local.then_some(window),
            softcap: (attn_cap > 0.0).then_some(attn_cap),
        };
        let rope = if local { &local_rope } else { &global_rope };
        let mut block = plain_block(gguf, i, &hyper, shape, rope.clone(), Activation::GeluTanh)?;
        let p = |n: &str| format!("blk.{i}.{n}.weight");
        block.attention.query_scale = query_scale;
        block.post_attn_norm = Some(gguf.vector_of(&p("post_attention_norm"), hidden)?);
        block.post_ffn_norm = Some(gguf.vector_of(&p("post_ffw_norm"), hidden)?);
        blocks.push(block);
    }
    let mut model = Decoder::new(gguf, "gemma2", &hyper, blocks)?;
    // llama.cpp reads no output matrix for Gemma 2, whatever the file holds.
    model.output = gguf.matmul("token_embd.weight")?;
    model.embedding_scale = (hidden as f32).sqrt();
    model.final_softcap = (final_cap > 0.0).then_some(final_cap);
    Ok(model)
}
