//! The `qwen3` architecture (Qwen 3 dense models): the shared decoder with each query and
//! key head RMS-normed before NeoX rotary embeddings, and a SiLU-gated feed-forward.

use super::decoder::{plain_block, Activation, Decoder, Hyper};
use super::ops::RopeStyle;
use crate::error::EngineError;
use crate::gguf::GgufFile;

/// Loads a `qwen3` model.
pub(super) fn load(gguf: &mut GgufFile) -> Result<Decoder, EngineError> {
    let hyper = Hyper::read(gguf, "qwen3", 10_000.0, 32_768, None)?;
    let head_dim = hyper.dims.head_dim;
    let (rope, shape) = (hyper.rope(RopeStyle::Neox), hyper.plain_shape());
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
