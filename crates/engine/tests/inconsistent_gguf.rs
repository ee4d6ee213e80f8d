//! A GGUF file whose metadata disagrees with its tensors (a hand-edited or half-converted
//! file) is refused at load with an error that names what disagrees: never a panic, never
//! a model that loads and computes with the wrong shapes.

mod common;

use candle_core::quantized::gguf_file::Value;
use ferrite_engine::gguf::GgufFile;
use ferrite_engine::{model, EngineError};
use ferrite_synth::gguf_writer::GgufWriter;
use ferrite_synth::{model_file, Arch, Spec, WeightType};

/// The architectures tried: the shared decoder's plain blocks, Q/K norms, Phi-3's fused
/// matrices and Gemma 3's post-norms.
const ARCHS: [Arch; 4] = [Arch::Llama, Arch::Qwen3, Arch::Phi3, Arch::Gemma3];

/// Writes `file` in memory and loads the model it holds.
fn load(file: &GgufWriter) -> Result<(), EngineError> {
    let mut bytes = Vec::new();
    file.write(&mut bytes).unwrap();
    let mut gguf = GgufFile::from_bytes("model.gguf", bytes)?;
    model::load(&mut gguf).map(|_| ())
}

/// One key of the architecture set to a value its tensors contradict.
struct Disagreement {
    /// The key, after the architecture's prefix.
    key: &'static str,
    /// What it is set to (the generated files are 4-6 blocks of width 512-768, 8 query
    /// heads of 64-128 wide, 2 key-value heads where grouped).
    value: u32,
}

const DISAGREEMENTS: &[Disagreement] = &[
    // The embedding twice as wide as the tensors.
    Disagreement {
        key: "embedding_length",
        value: 1024,
    },
    // One block more than the file has.
    Disagreement {
        key: "block_count",
        value: 7,
    },
    // Query heads that do not make the query matrix's rows.
    Disagreement {
        key: "attention.head_count",
        value: 5,
    },
    // Key-value heads that do not make the key matrix's rows.
    Disagreement {
        key: "attention.head_count_kv",
        value: 3,
    },
    // Heads wider than the matrices.
    Disagreement {
        key: "attention.key_length",
        value: 256,
    },
    // A feed-forward width the matrices do not have.
    Disagreement {
        key: "feed_forward_length",
        value: 1000,
    },
];

#[test]
fn metadata_that_disagrees_with_the_tensors_is_an_error_not_a_panic() {
    let tokenizer = common::model_path("smollm2-135m");
    let mut failures = Vec::new();
    for arch in ARCHS {
        let spec = Spec::small(arch, WeightType::Q8_0);
        for d in DISAGREEMENTS {
            let key = format!("{}.{}", arch.gguf_name(), d.key);
            let mut file = model_file(&spec, &tokenizer).unwrap();
            file.meta(key.clone(), Value::U32(d.value));
            match std::panic::catch_unwind(|| load(&file)) {
                Err(_) => failures.push(format!("{key} = {}: the load panicked", d.value)),
                Ok(Ok(())) => failures.push(format!("{key} = {}: the model loaded", d.value)),
                Ok(Err(e)) => {
                    // It names the tensor that disagrees, or the heads that cannot be.
                    let message = e.to_string();
                    eprintln!("{key} = {}: {message}", d.value);
                    let named = ["tensor `", "heads cannot share"]
                        .iter()
                        .any(|n| message.contains(n));
                    if !named {
                        failures.push(format!("{key} = {}: {message}", d.value));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_unchanged_files_load() {
    // The check above is not vacuous: the same files with their own metadata load.
    let tokenizer = common::model_path("smollm2-135m");
    for arch in ARCHS {
        let file = model_file(&Spec::small(arch, WeightType::Q8_0), &tokenizer).unwrap();
        let loaded = load(&file);
        assert!(loaded.is_ok(), "{}: {:?}", arch.name(), loaded.err());
    }
}
