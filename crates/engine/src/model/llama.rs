//! The `llama` architecture (Llama 2 and 3, Mistral, SmolLM2, …): the shared decoder with
//! interleaved rotary embeddings, attention scaled by 1/√head_dim inside the kernel, and a
//! SiLU-gated feed-forward. Llama 3.1's `llama3` RoPE scaling comes as a `rope_freqs`
//! tensor of per-frequency factors.

use super::decoder::{plain_block, Activation, Decoder, Hyper};
use super::ops::RopeStyle;
use crate::error::EngineError;
use crate::gguf::GgufFile;

/// Loads a `llama` model.
pub(super) fn load(gguf: &mut GgufFile) -> Result<Decoder, EngineError> {
    let hyper = Hyper::read(gguf, "llama", 10_000.0, 4096, None)?;
    let head_dim = hyper.dims.head_dim;
    let freq_factors = if gguf.has_tensor("rope_freqs.weight") {
        Some(gguf.vector_of("rope_freqs.weight", head_dim / 2)?)
    } else {
        None
    };
    let rope = hyper
        .rope(RopeStyle::Interleaved)
        .with_freq_factors(freq_factors);
    let shape = hyper.plain_shape();
    let blocks = (0..hyper.dims.n_layers)
        .map(|i| plain_block(gguf, i, &hyper, shape, rope.clone(), Activation::Silu))
        .collect::<Result<_, _>>()?;
    Decoder::new(gguf, "llama", &hyper, blocks)
}
