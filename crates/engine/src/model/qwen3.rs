//! The `qwen3` architecture (Qwen 3 dense models): the shared decoder with each query and
//! key head RMS-normed before NeoX rotary embeddings, and a SiLU-gated feed-forward.

use super::attention::AttentionShape;
use super::decoder::{plain_block, Activation, Decoder, Hyper};
use super::ops::{Rope, RopeStyle};
use crate::gguf::GgufFile;
use crate::EngineError;

/// Loads a `qwen3` model.
pub(super) fn load(gguf: &mut GgufFile) -> Result<Decoder, EngineError> {
    let hyper = Hyper::read(gguf, "qwen3", 10_000.0, 32_768, None)?;
    let head_dim = hyper.dims.head_dim;
    let rope = Rope::new(
        head_dim,
        hyper.rope_theta,
        hyper.rope_scale,
        RopeStyle::Neox,
    );
    let shape = AttentionShape {
        n_head: hyper.dims.n_head,
        n_kv_head: hyper.dims.n_kv_head,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        window: None,
        softcap: None,
    };
    let mut blocks = Vec::with_capacity(hyper.dims.n_layers);
    for i in 0..hyper.dims.n_layers {
        let mut block = plain_block(gguf, i, &hyper, shape, rope.clone(), Activation::Silu)?;
        let p = |n: &str| format!("blk.{i}.{n}.weight");
        block.attention.qk_norm = Some([
            gguf.vector_of(&p("attn_q_norm"), head_dim)?,
            gguf.vector_of(&p("attn_k_norm"), head_dim)?,
        ]);
        blocks.push(block);
    }
    Decoder::new(gguf, "qwen3", &hyper, blocks)
}
