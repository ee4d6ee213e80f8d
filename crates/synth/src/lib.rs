//! Seeded random-weight GGUF models of every architecture and weight type ferrite serves.
//!
//! A random-weight file exercises every tensor of an architecture and every bit of a
//! weight format, and because ferrite follows llama.cpp's arithmetic, its greedy tokens
//! and log-probabilities on such a file must equal llama-server's on the same file. The
//! files are made, not downloaded or committed: the same arguments give the same bytes on
//! any machine, so a fixture recorded from llama.cpp once (`fixtures/synth/`) checks a
//! file the tests regenerate. The tokenizer is copied from a real model's GGUF (the
//! prompts are token ids, so which one does not matter to the architecture).
#![deny(missing_docs)]

pub mod arch;
pub mod gguf_writer;
pub mod quants;
pub mod rng;
pub mod vision;

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};

pub use arch::{Arch, Shape};
use arch::{Init, TensorSpec};
use gguf_writer::{GgufWriter, TensorData};
pub use quants::WeightType;
use rng::Rng;
pub use vision::{write_projector, Projector, ProjectorSpec, VisionShape};

/// What to generate.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The architecture.
    pub arch: Arch,
    /// The type of the weight matrices (norms and biases stay `f32`).
    pub weights: WeightType,
    /// Which matrices take another type.
    pub mix: Mix,
    /// The size.
    pub shape: Shape,
    /// The seed of every tensor's values.
    pub seed: u64,
    /// The projector whose prompt tokens are added to the copied vocabulary (as special
    /// tokens at its end), for a text model that pairs with it.
    pub image_tokens: Option<Projector>,
    /// The training context the file declares, when not the architecture's default
    /// (8,192): a long one for long-prompt benchmarks.
    pub context_length: Option<u32>,
}

impl Spec {
    /// The small test model of an architecture in a weight type, seed 0.
    pub fn small(arch: Arch, weights: WeightType) -> Self {
        Self {
            arch,
            weights,
            mix: Mix::Uniform,
            shape: arch.small_shape(),
            seed: 0,
            image_tokens: None,
            context_length: None,
        }
    }

    /// The file name tests and fixtures use: `<arch>-<type>.gguf`.
    pub fn file_name(&self) -> String {
        format!("{}-{}.gguf", self.arch.name(), self.weights.name())
    }
}

/// Which weight matrices take a type other than the file's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// Every weight matrix in the file's type.
    Uniform,
    /// The types `llama-quantize` gives each matrix of a file of that type (without an
    /// importance matrix), for Q4_K and Q5_K (its `Q4_K_M`, `Q5_K_M`) and IQ4_XS: Q6_K for
    /// the output matrix (the token embedding where it is tied); for the K-quants Q6_K for
    /// the value and feed-forward down projections of the layers its `use_more_bits`
    /// picks (the first and last eighth and every third between); for IQ4_XS Q5_K for
    /// the value projections (with four or more query heads per key head) and for the
    /// down projections of the first eighth of the layers. A fused QKV matrix (`phi3`)
    /// counts as a value projection, as llama.cpp's `category_is_attn_v` has it.
    ///
    /// Not modelled: llama-quantize falls back to another type for a matrix whose rows
    /// are not a multiple of 256 wide (a K-quant or IQ4_XS block); every shape this
    /// generator writes has rows a multiple of 256, so the fallback never applies.
    LlamaQuantize,
}

impl Mix {
    /// The types [`Mix::LlamaQuantize`] has a recipe for.
    pub const LLAMA_QUANTIZE_TYPES: [WeightType; 3] =
        [WeightType::Q4K, WeightType::Q5K, WeightType::Iq4Xs];

    /// The type of weight matrix `name` in a file of `weights` of `shape`.
    fn type_of(self, name: &str, weights: WeightType, shape: &Shape, tied: bool) -> WeightType {
        if self == Self::Uniform || !Self::LLAMA_QUANTIZE_TYPES.contains(&weights) {
            return weights;
        }
        let n = shape.layers;
        let more_bits = |i: usize| i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
        let layer = name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split('.').next()?.parse::<usize>().ok());
        let (value, down) = (
            name.ends_with(".attn_v.weight") || name.ends_with(".attn_qkv.weight"),
            name.ends_with(".ffn_down.weight"),
        );
        if name == "output.weight" || (tied && name == "token_embd.weight") {
            return WeightType::Q6K;
        }
        match (weights, layer) {
            (WeightType::Q4K | WeightType::Q5K, Some(i)) if (value || down) && more_bits(i) => {
                WeightType::Q6K
            }
            (WeightType::Iq4Xs, _) if value && shape.heads / shape.kv_heads >= 4 => WeightType::Q5K,
            (WeightType::Iq4Xs, Some(i)) if down && i < n / 8 => WeightType::Q5K,
            _ => weights,
        }
    }
}

/// Writes the model `spec` describes to `out`, with the tokenizer metadata of the GGUF
/// file `tokenizer_from`.
pub fn write_model(spec: &Spec, tokenizer_from: &Path, out: &Path) -> io::Result<()> {
    let w = model_file(spec, tokenizer_from)?;
    let mut file = BufWriter::new(File::create(out)?);
    w.write(&mut file)?;
    io::Write::flush(&mut file)
}

/// The model `spec` describes, assembled but not written (so that a test can change a
/// key before writing it).
pub fn model_file(spec: &Spec, tokenizer_from: &Path) -> io::Result<GgufWriter> {
    let mut tokenizer = tokenizer_metadata(tokenizer_from)?;
    if let Some(projector) = spec.image_tokens {
        add_special_tokens(&mut tokenizer, &projector.added_tokens());
    }
    let vocab = match tokenizer.iter().find(|(k, _)| k == "tokenizer.ggml.tokens") {
        Some((_, Value::Array(tokens))) => tokens.len(),
        _ => {
            return Err(invalid(format!(
                "{} has no token list",
                tokenizer_from.display()
            )))
        }
    };
    let mut w = GgufWriter::default();
    let arch = spec.arch;
    w.meta(
        "general.architecture",
        Value::String(arch.gguf_name().into()),
    );
    w.meta(
        "general.name",
        // Not the architecture's name: llama.cpp patches the vocabulary of a model whose
        // name says `phi3`, looking up tokens the copied vocabulary lacks.
        Value::String(format!(
            "ferrite-synth random weights ({})",
            spec.weights.name()
        )),
    );
    w.meta("general.file_type", Value::U32(spec.weights.file_type()));
    w.meta("general.quantization_version", Value::U32(2));
    let context_key = format!("{}.context_length", arch.gguf_name());
    for (key, value) in arch.metadata(&spec.shape, vocab) {
        match spec.context_length {
            Some(n) if key == context_key => w.meta(key, Value::U32(n)),
            _ => w.meta(key, value),
        }
    }
    for (key, value) in tokenizer {
        w.meta(key, value);
    }
    let tensors = arch.tensors(&spec.shape, vocab);
    let tied = !tensors.iter().any(|t| t.name == "output.weight");
    for tensor in tensors {
        w.tensor(tensor_data(spec, tensor, tied)?);
    }
    Ok(w)
}

/// The `tokenizer.*` metadata of a GGUF file, in key order.
fn tokenizer_metadata(path: &Path) -> io::Result<Vec<(String, Value)>> {
    let mut file = io::BufReader::new(File::open(path)?);
    let content =
        Content::read(&mut file).map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    let mut out: Vec<(String, Value)> = content
        .metadata
        .into_iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// `tokens` appended to a vocabulary's token list as control tokens (type 3), with a
/// score of zero where the vocabulary has scores.
fn add_special_tokens(tokenizer: &mut [(String, Value)], tokens: &[String]) {
    for (key, value) in tokenizer.iter_mut() {
        let Value::Array(values) = value else {
            continue;
        };
        let extra = |v: fn(&String) -> Value| tokens.iter().map(v).collect::<Vec<_>>();
        match key.as_str() {
            "tokenizer.ggml.tokens" => values.extend(extra(|t| Value::String(t.clone()))),
            "tokenizer.ggml.token_type" => values.extend(extra(|_| Value::I32(3))),
            "tokenizer.ggml.scores" => values.extend(extra(|_| Value::F32(0.0))),
            _ => {}
        }
    }
}

fn tensor_data(spec: &Spec, t: TensorSpec, tied: bool) -> io::Result<TensorData> {
    let mut rng = Rng::for_name(spec.seed, &t.name);
    let n: usize = t.dims.iter().product();
    let f32_bytes = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (ggml_type, bytes) = match t.init {
        Init::Weight(std) => {
            let ty = spec.mix.type_of(&t.name, spec.weights, &spec.shape, tied);
            let row = *t.dims.last().unwrap();
            if !row.is_multiple_of(ty.block_len()) {
                return Err(invalid(format!(
                    "`{}` rows of {row} are not whole {} blocks",
                    t.name,
                    ty.name()
                )));
            }
            (ty.ggml_id(), ty.random(&mut rng, n, std))
        }
        Init::Vector { center, spread } => {
            let v = (0..n)
                .map(|_| center + spread * (2.0 * rng.next_f32() - 1.0))
                .collect();
            (0, f32_bytes(v))
        }
        Init::Values(v) => (0, f32_bytes(v)),
        Init::Float(std) => (0, WeightType::F32.random(&mut rng, n, std)),
    };
    Ok(TensorData {
        name: t.name,
        dims: t.dims,
        ggml_type,
        bytes,
    })
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layers `llama-quantize` gives more bits in a 16-layer model, and the rest of its
    /// recipes, on a Llama-3.2-1B shape.
    #[test]
    fn llama_quantize_mix_follows_its_recipe() {
        let shape = Arch::Llama.one_b_shape();
        let mix = Mix::LlamaQuantize;
        let down =
            |ty, i: usize| mix.type_of(&format!("blk.{i}.ffn_down.weight"), ty, &shape, true);
        let value = |ty, i: usize| mix.type_of(&format!("blk.{i}.attn_v.weight"), ty, &shape, true);
        let more = [0, 1, 4, 7, 10, 13, 14, 15];
        for i in 0..16 {
            let want = if more.contains(&i) {
                WeightType::Q6K
            } else {
                WeightType::Q4K
            };
            assert_eq!(down(WeightType::Q4K, i), want, "ffn_down {i}");
            assert_eq!(value(WeightType::Q4K, i), want, "attn_v {i}");
            let want = if i < 2 {
                WeightType::Q5K
            } else {
                WeightType::Iq4Xs
            };
            assert_eq!(down(WeightType::Iq4Xs, i), want, "IQ4_XS ffn_down {i}");
            // 32 query heads share 8 key heads: four per key head.
            assert_eq!(value(WeightType::Iq4Xs, i), WeightType::Q5K);
            let q = mix.type_of(
                &format!("blk.{i}.attn_q.weight"),
                WeightType::Q5K,
                &shape,
                true,
            );
            assert_eq!(q, WeightType::Q5K);
        }
        for ty in Mix::LLAMA_QUANTIZE_TYPES {
            assert_eq!(
                mix.type_of("token_embd.weight", ty, &shape, true),
                WeightType::Q6K
            );
            assert_eq!(mix.type_of("token_embd.weight", ty, &shape, false), ty);
            assert_eq!(
                mix.type_of("output.weight", ty, &shape, false),
                WeightType::Q6K
            );
        }
        let uniform = Mix::Uniform.type_of("output.weight", WeightType::Q4K, &shape, false);
        assert_eq!(uniform, WeightType::Q4K);
        // A type without a recipe keeps its own type everywhere.
        let q8 = mix.type_of("output.weight", WeightType::Q8_0, &shape, false);
        assert_eq!(q8, WeightType::Q8_0);
    }

    /// phi3's fused QKV matrix takes the value projection's recipe.
    #[test]
    fn llama_quantize_mix_treats_fused_qkv_as_a_value_projection() {
        let shape = Arch::Phi3.one_b_shape();
        let mix = Mix::LlamaQuantize;
        let qkv =
            |ty, i: usize| mix.type_of(&format!("blk.{i}.attn_qkv.weight"), ty, &shape, false);
        assert_eq!(qkv(WeightType::Q5K, 0), WeightType::Q6K);
        assert_eq!(qkv(WeightType::Q4K, 0), WeightType::Q6K);
        assert_eq!(qkv(WeightType::Q4K, 2), WeightType::Q4K);
    }
}
