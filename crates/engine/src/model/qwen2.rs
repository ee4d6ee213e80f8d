//! The `qwen2` architecture (Qwen 2 and 2.5): the shared decoder with biases on the query,
//! key and value projections, NeoX rotary embeddings and a SiLU-gated feed-forward.

use super::decoder::{plain_block, Activation, Decoder, Hyper};
use super::ops::RopeStyle;
use crate::error::EngineError;
use crate::gguf::GgufFile;

/// Loads a `qwen2` model.
pub(super) fn load(gguf: &mut GgufFile) -> Result<Decoder, EngineError> {
    let hyper = Hyper::read(gguf, "qwen2", 10_000.0, 32_768, None)?;
    let (rope, shape) = (hyper.rope(RopeStyle::Neox), hyper.plain_shape());
    let mut blocks = Vec::with_capacity(hyper.dims.n_layers);
    for i in 0..hyper.dims.n_layers {
        let mut block = plain_block(gguf, i, &hyper, shape, rope.clone(), Activation::Silu)?;
        let p = |n: &str| format!("blk.{i}.{n}.bias");
        block.attention.qkv_bias = Some([
            gguf.vector_of(&p("attn_q"), hyper.q_width())?,
            gguf.vector_of(&p("attn_k"), hyper.kv_width())?,
            gguf.vector_of(&p("attn_v"), hyper.kv_width())?,
        ]);
        blocks.push(block);
    }
    Decoder::new(gguf, "qwen2", &hyper, blocks)
}
