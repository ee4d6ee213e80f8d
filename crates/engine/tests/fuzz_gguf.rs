//! Fuzzing the GGUF reader and model loaders (proptest; cargo-fuzz needs a nightly
//! toolchain this project does not use). Inputs are complete tiny models of both
//! architectures with random mutations: bit flips, integers overwritten with boundary
//! values, truncations, insertions and removals. Every input must give a model or an
//! error, never a panic; a model that loads must run a forward step.
//!
//! `cargo test --release -p ferrite-engine --test fuzz_gguf` runs a quick batch; with
//! `FERRITE_FUZZ_SECONDS=600` it runs batches for ten minutes (see RELIABILITY.md).

mod common;

use common::gguf_bytes::tiny_model;
use ferrite_engine::gguf::GgufFile;
use ferrite_engine::model::{self, BatchEntry, Logits};
use ferrite_engine::tokenizer::Tokenizer;
use proptest::prelude::*;

/// One change to a file's bytes; positions are taken modulo the length.
#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Word { at: usize, value: u64, wide: bool },
    Truncate { at: usize },
    Insert { at: usize, bytes: Vec<u8> },
    Remove { at: usize, len: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let boundary = prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(255),
        Just(u64::from(u32::MAX)),
        Just(1 << 31),
        Just(1 << 32),
        Just(1 << 40),
        Just(u64::MAX),
        Just(u64::MAX / 2),
        any::<u64>(),
        0u64..64,
    ];
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (any::<usize>(), boundary, any::<bool>()).prop_map(|(at, value, wide)| Mutation::Word {
            at,
            value,
            wide
        }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (any::<usize>(), 1usize..64).prop_map(|(at, len)| Mutation::Remove { at, len }),
    ]
}

fn apply(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        if bytes.is_empty() {
            break;
        }
        let pos = |at: usize| at % bytes.len();
        match m {
            Mutation::Flip { at, bit } => {
                let i = pos(*at);
                bytes[i] ^= 1 << bit;
            }
            Mutation::Word { at, value, wide } => {
                let i = pos(*at);
                let word = if *wide {
                    value.to_le_bytes().to_vec()
                } else {
                    (*value as u32).to_le_bytes().to_vec()
                };
                let end = (i + word.len()).min(bytes.len());
                bytes[i..end].copy_from_slice(&word[..end - i]);
            }
            Mutation::Truncate { at } => {
                let i = pos(*at);
                bytes.truncate(i);
            }
            Mutation::Insert { at, bytes: new } => {
                let i = pos(*at);
                bytes.splice(i..i, new.iter().copied());
            }
            Mutation::Remove { at, len } => {
                let i = pos(*at);
                let end = (i + len).min(bytes.len());
                bytes.drain(i..end);
            }
        }
    }
    bytes
}

/// Reads, tokenizes with and loads a file, and runs a step of whatever loads.
fn exercise(bytes: Vec<u8>) -> Result<(), ferrite_engine::EngineError> {
    // A panic inside candle's reader is caught and turned into an error; it still counts
    // as a finding (a case neither candle nor our checks handle).
    let caught = ferrite_engine::gguf::caught_panics();
    let result = exercise_counted(bytes);
    assert_eq!(
        ferrite_engine::gguf::caught_panics(),
        caught,
        "a panic inside candle's reader was caught: {result:?}"
    );
    result
}

fn exercise_counted(bytes: Vec<u8>) -> Result<(), ferrite_engine::EngineError> {
    let mut gguf = GgufFile::from_bytes("fuzz.gguf", bytes)?;
    let tokenizer = Tokenizer::from_gguf(&gguf.meta);
    if let Ok(t) = &tokenizer {
        let ids = t.encode_prompt("ab a b");
        let _ = t.decode(&ids, false);
    }
    let model = model::load(&mut gguf)?;
    let vocab = model.info().vocab_size as u32;
    let tokens: Vec<u32> = [0, 2, 4].iter().map(|t| t % vocab).collect();
    let mut cache = model.new_cache(tokens.len() + 1);
    let rows = model.forward(&mut [BatchEntry {
        tokens: &tokens,
        cache: &mut cache,
        logits: Logits::Last,
        prompt_len: tokens.len(),
        images: Vec::new(),
        grids: Vec::new(),
    }])?;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].len(), vocab as usize);
    Ok(())
}

#[test]
fn the_tiny_models_load_and_run() {
    for arch in ["llama", "gemma3"] {
        exercise(tiny_model(arch).build()).unwrap_or_else(|e| panic!("{arch}: {e}"));
    }
}

#[test]
fn fuzz_gguf_reader_and_loaders() {
    let seeds = [tiny_model("llama").build(), tiny_model("gemma3").build()];
    let strategy = (0..seeds.len(), prop::collection::vec(mutation(), 1..6));
    ferrite_fuzz::run("gguf", strategy, 3000, 2000, |(seed, mutations)| {
        let _ = exercise(apply(seeds[seed].clone(), &mutations));
    });
}

/// The cargo-fuzz target's committed seeds (`libfuzzer/corpus/gguf`) are the
/// tiny models this file builds; with `FERRITE_WRITE_FUZZ_SEEDS` set, writes them there
/// first (after a change to the builder).
#[test]
fn cargo_fuzz_seeds_are_the_tiny_models() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../libfuzzer/corpus/gguf");
    for arch in ["llama", "gemma3"] {
        let path = dir.join(format!("tiny-{arch}.gguf"));
        let bytes = tiny_model(arch).build();
        if std::env::var_os("FERRITE_WRITE_FUZZ_SEEDS").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            committed == bytes,
            "{} is stale: rerun with FERRITE_WRITE_FUZZ_SEEDS=1",
            path.display()
        );
    }
}
