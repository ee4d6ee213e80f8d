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

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};

pub use arch::{Arch, Shape};
use arch::{Init, TensorSpec};
use gguf_writer::{GgufWriter, TensorData};
pub use quants::WeightType;
use rng::Rng;

/// What to generate.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The architecture.
    pub arch: Arch,
    /// The type of every weight matrix (norms and biases stay `f32`).
    pub weights: WeightType,
    /// The size.
    pub shape: Shape,
    /// The seed of every tensor's values.
    pub seed: u64,
}

impl Spec {
    /// The small test model of an architecture in a weight type, seed 0.
    pub fn small(arch: Arch, weights: WeightType) -> Self {
        Self {
            arch,
            weights,
            shape: arch.small_shape(),
            seed: 0,
        }
    }

    /// The file name tests and fixtures use: `<arch>-<type>.gguf`.
    pub fn file_name(&self) -> String {
        format!("{}-{}.gguf", self.arch.name(), self.weights.name())
    }
}

/// Writes the model `spec` describes to `out`, with the tokenizer metadata of the GGUF
/// file `tokenizer_from`.
pub fn write_model(spec: &Spec, tokenizer_from: &Path, out: &Path) -> io::Result<()> {
    let tokenizer = tokenizer_metadata(tokenizer_from)?;
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
    for (key, value) in arch.metadata(&spec.shape, vocab) {
        w.meta(key, value);
    }
    for (key, value) in tokenizer {
        w.meta(key, value);
    }
    for tensor in arch.tensors(&spec.shape, vocab) {
        w.tensor(tensor_data(spec, tensor)?);
    }
    let mut file = BufWriter::new(File::create(out)?);
    w.write(&mut file)?;
    io::Write::flush(&mut file)
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

fn tensor_data(spec: &Spec, t: TensorSpec) -> io::Result<TensorData> {
    let mut rng = Rng::for_name(spec.seed, &t.name);
    let n: usize = t.dims.iter().product();
    let f32_bytes = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (ggml_type, bytes) = match t.init {
        Init::Weight(std) => {
            let ty = spec.weights;
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
