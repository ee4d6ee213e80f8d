//! The `qwen2` architecture (Qwen 2 and 2.5): the shared decoder with biases on the query,
//! key and value projections, NeoX rotary embeddings and a SiLU-gated feed-forward; and
//! `qwen2vl` (Qwen2-VL's and Qwen2.5-VL's text model), the same with multi-section rotary
//! positions (M-RoPE: a token of text is at the same position in each section, so its
//! rotation is `qwen2`'s).

use super::decoder::{plain_block, Activation, Decoder, Hyper};
use super::ops::RopeStyle;
use crate::error::EngineError;
use crate::gguf::GgufFile;

/// Loads a `qwen2` or `qwen2vl` model (`arch`).
pub(super) fn load(gguf: &mut GgufFile, arch: &str) -> Result<Decoder, EngineError> {
    let hyper = Hyper::read(gguf, arch, 10_000.0, 32_768, None)?;
    let mut rope = hyper.rope(RopeStyle::Neox);
    if arch == "qwen2vl" {
        rope = rope.with_sections(sections(gguf, hyper.dims.head_dim)?);
    }
    let shape = hyper.plain_shape();
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
    Decoder::new(gguf, arch, &hyper, blocks)
}

/// `qwen2vl.rope.dimension_sections`: four counts of rotary pairs, together at most the
/// head's width (llama.cpp's bound; Qwen2-VL's 16, 24, 24 and 0 are its 64 pairs).
fn sections(gguf: &GgufFile, head_dim: usize) -> Result<[usize; 4], EngineError> {
    let key = "qwen2vl.rope.dimension_sections";
    let values = gguf.meta.i32_array(key)?;
    let invalid = || {
        EngineError::InvalidModel(format!(
            "`{key}` is {values:?}: four counts of rotary pairs, at least one and together at \
             most the head's width {head_dim}, are expected"
        ))
    };
    let sections: [i32; 4] = values.as_slice().try_into().map_err(|_| invalid())?;
    if sections.iter().any(|&n| n < 0) {
        return Err(invalid());
    }
    let sections = sections.map(|n| n as usize);
    let total: usize = sections.iter().sum();
    if total == 0 || total > head_dim {
        return Err(invalid());
    }
    Ok(sections)
}
