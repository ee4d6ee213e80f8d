//! Bad model files give a clear error naming the file and the problem, never a panic or
//! an allocation the file's size does not justify.

mod common;

use common::gguf_bytes::{small_llama, GgufBytes, Meta};
use ferrite_engine::gguf::GgufFile;
use ferrite_engine::{model, EngineError};

/// Loads a model from bytes, as the server does from a file; the error's text.
fn load_error(bytes: Vec<u8>) -> String {
    let result = GgufFile::from_bytes("bad.gguf", bytes).and_then(|mut gguf| {
        ferrite_engine::tokenizer::Tokenizer::from_gguf(&gguf.meta)?;
        model::load(&mut gguf).map(|_| ())
    });
    match result {
        Ok(()) => panic!("a bad model loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_small_llama_file_reads_and_its_tensors_load() {
    let mut gguf = GgufFile::from_bytes("small.gguf", small_llama().build()).unwrap();
    assert_eq!(gguf.vector("output_norm.weight").unwrap().len(), 8);
    let err = model::load(&mut gguf).err().expect("not a whole model");
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn a_truncated_file_says_so() {
    let bytes = small_llama().build();
    for keep in [0, 3, 10, 100, bytes.len() / 2, bytes.len() - 1] {
        let err = load_error(bytes[..keep].to_vec());
        assert!(err.contains("bad.gguf"), "{keep}: {err}");
    }
    let err = load_error(bytes[..bytes.len() - 1].to_vec());
    assert!(err.contains("past the end of the file"), "{err}");
}

#[test]
fn garbage_is_not_a_gguf_file() {
    let err = load_error(b"this is not a model at all, just some text".to_vec());
    assert!(err.contains("bad.gguf is not a valid GGUF file"), "{err}");
}

#[test]
fn an_unknown_architecture_is_named() {
    let bytes = GgufBytes::default()
        .meta("general.architecture", Meta::Str("mamba9".into()))
        .meta("tokenizer.ggml.model", Meta::Str("gpt2".into()))
        .meta(
            "tokenizer.ggml.tokens",
            Meta::Strs(vec!["a".into(), "b".into()]),
        )
        .meta("tokenizer.ggml.merges", Meta::Strs(vec![]))
        .build();
    let mut gguf = GgufFile::from_bytes("bad.gguf", bytes).unwrap();
    let err = model::load(&mut gguf).err().unwrap();
    assert!(matches!(err, EngineError::Unsupported(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("mamba9") && text.contains("bad.gguf"),
        "{text}"
    );
}

#[test]
fn an_unknown_tensor_type_is_an_error() {
    let bytes = small_llama()
        .tensor("blk.0.ffn_up.weight", &[32, 2], 99, vec![0; 64])
        .build();
    let err = load_error(bytes);
    assert!(err.contains("bad.gguf") && err.contains("99"), "{err}");
}

#[test]
fn impossible_shapes_and_offsets_are_refused_before_allocating() {
    // 2^62 elements of f32: the file does not hold them.
    let huge = small_llama()
        .tensor("big", &[1 << 31, 1 << 31], 0, vec![0; 32])
        .build();
    let err = load_error(huge);
    assert!(err.contains("past the end"), "{err}");
    let overflow = small_llama()
        .tensor("big", &[u64::MAX / 2, 4], 0, vec![0; 32])
        .build();
    let err = load_error(overflow);
    assert!(err.contains("impossible shape"), "{err}");
}

#[test]
fn hostile_counts_and_alignment_are_errors() {
    let mut bytes = small_llama().build();
    // The tensor count (bytes 8..16) and metadata count (16..24) claim billions.
    bytes[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(load_error(bytes.clone()).contains("bad.gguf"));
    let mut bytes = small_llama().build();
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(load_error(bytes).contains("bad.gguf"));
    let zero_alignment = small_llama()
        .meta("general.alignment", Meta::U32(0))
        .build();
    assert!(load_error(zero_alignment).contains("bad.gguf"));
}
