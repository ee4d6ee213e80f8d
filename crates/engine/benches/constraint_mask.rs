//! What a JSON-schema constraint costs per token: the time to compute the allowed-token
//! mask over SmolLM2's vocabulary, apply it to a logits row and consume the token, walked
//! along a document the schema accepts. Compare with the decode step (BENCHMARKS.md).
//!
//!     cargo bench -p ferrite-engine --bench constraint_mask

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ferrite_engine::constrain::{regexes, ConstraintFactory, Grammar, GrammarKind};
use ferrite_engine::gguf::GgufFile;
use ferrite_engine::tokenizer::Tokenizer;

const SCHEMA: &str = r#"{"type":"array","minItems":1,"items":{"type":"object","properties":{"n":{"type":"integer"},"w":{"type":"string","maxLength":12}},"required":["n","w"],"additionalProperties":false},"x-guidance":{"whitespace_flexible":false,"item_separator":", ","key_separator":": "}}"#;

fn model_path() -> PathBuf {
    let home = std::env::var_os("FERRITE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/ferrite"));
    home.join("models/smollm2-135m.gguf")
}

fn main() {
    let gguf = GgufFile::open(&model_path()).expect("run `ferrite pull smollm2-135m` first");
    let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf.meta).unwrap());
    let started = Instant::now();
    let factory = ConstraintFactory::new(
        Arc::clone(&tokenizer),
        regexes::DEFAULT_MAX_REGEX_MATCH_BYTES,
    )
    .unwrap();
    println!(
        "vocabulary indexed for grammars in {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    let grammar = Grammar {
        kind: GrammarKind::JsonSchema,
        source: SCHEMA.into(),
    };
    let items: Vec<String> = (0..60)
        .map(|i| format!(r#"{{"n": {}, "w": "word{}"}}"#, i * 37, i % 9))
        .collect();
    let document = format!("[{}]", items.join(", "));
    let tokens = tokenizer.encode(&document, false);
    let mut logits = vec![0f32; tokenizer.vocab_size()];
    let mut samples = Vec::new();
    for _ in 0..5 {
        let mut constraint = factory.compile(&grammar).unwrap();
        let started = Instant::now();
        for &t in &tokens {
            constraint.mask(&mut logits).unwrap();
            assert!(
                logits[t as usize].is_finite(),
                "the document leaves the grammar"
            );
            constraint.consume(t).unwrap();
            logits.iter_mut().for_each(|l| *l = 0.0);
        }
        samples.push(started.elapsed().as_secs_f64() / tokens.len() as f64);
    }
    samples.sort_by(f64::total_cmp);
    println!(
        "mask + apply + consume: {:.3} ms per token (median of 5 walks over {} tokens)",
        samples[2] * 1e3,
        tokens.len()
    );
}
