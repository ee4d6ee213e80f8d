//! The `gemma3` architecture: Gemma 3 text models. What differs from the shared decoder:
//! the embedding scaled by √hidden, RMS-normed queries and keys, norms after attention and
//! feed-forward too, queries scaled by 1/√head_dim before attention, GELU (tanh) gating,
//! NeoX rotary embeddings, and five sliding-window layers (with their own rotary base) for
//! every global one.

use super::attention::AttentionShape;
use super::decoder::{plain_block, Activation, Decoder, Hyper};
use super::ops::{Rope, RopeStyle};
use crate::error::EngineError;
use crate::gguf::GgufFile;

/// Every `SLIDING_WINDOW_PATTERN`-th layer attends globally; the others use the window.
const SLIDING_WINDOW_PATTERN: usize = 6;
/// Rotary base of the sliding-window layers.
const LOCAL_ROPE_THETA: f32 = 10_000.0;

/// Loads a `gemma3` model.
pub(super) fn load(gguf: &mut GgufFile) -> Result<Decoder, EngineError> {
    let hyper = Hyper::read(gguf, "gemma3", 1_000_000.0, 32_768, Some(256))?;
    let (head_dim, hidden) = (hyper.dims.head_dim, hyper.dims.hidden);
    let window = gguf
        .meta
        .u32("gemma3.attention.sliding_window")
        .map_or(4096, |v| v as usize);
    let global_rope = Rope::new(
        head_dim,
        hyper.rope_theta,
        hyper.rope_scale,
        RopeStyle::Neox,
    );
    let local_rope = Rope::new(head_dim, LOCAL_ROPE_THETA, 1.0, RopeStyle::Neox);
    let mut blocks = Vec::with_capacity(hyper.dims.n_layers);
    for i in 0..hyper.dims.n_layers {
        let local = (i + 1) % SLIDING_WINDOW_PATTERN != 0;
        let shape = AttentionShape {
            n_head: hyper.dims.n_head,
            n_kv_head: hyper.dims.n_kv_head,
            head_dim,
            // Queries are scaled before attention, as Gemma specifies.
            scale: 1.0,
            window: local.then_some(window),
            softcap: None,
        };
        let rope = if local { &local_rope } else { &global_rope };
        let mut block = plain_block(gguf, i, &hyper, shape, rope.clone(), Activation::GeluTanh)?;
        let p = |n: &str| format!("blk.{i}.{n}.weight");
        block.attention.qk_norm = Some([
            gguf.vector_of(&p("attn_q_norm"), head_dim)?,
            gguf.vector_of(&p("attn_k_norm"), head_dim)?,
        ]);
        block.attention.query_scale = 1.0 / (head_dim as f32).sqrt();
        block.post_attn_norm = Some(gguf.vector_of(&p("post_attention_norm"), hidden)?);
        block.post_ffn_norm = Some(gguf.vector_of(&p("post_ffw_norm"), hidden)?);
        blocks.push(block);
    }
    let mut model = Decoder::new(gguf, "gemma3", &hyper, blocks)?;
    model.embedding_scale = (hidden as f32).sqrt();
    Ok(model)
}
