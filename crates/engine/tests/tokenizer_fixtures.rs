//! Our tokenizers give llama.cpp's ids for every fixture string, for both models.

mod common;

use ferrite_engine::gguf::GgufFile;
use ferrite_engine::tokenizer::Tokenizer;

#[test]
fn tokenizers_match_llama_cpp() {
    for (model, fixture) in common::MODELS {
        let gguf = GgufFile::open(&common::model_path(model)).unwrap();
        let tok = Tokenizer::from_gguf(&gguf.meta).unwrap();
        let data = common::fixture(fixture);
        let cases = data["tokenize_without_special"].as_array().unwrap();
        assert_eq!(cases.len(), 23, "{model}: fixture has 23 strings");
        let mut failures = Vec::new();
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = common::ids(&case["ids"]);
            let got = tok.encode(text, true);
            if got != want {
                failures.push(format!("{model} {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
            // Decoding gives the text back (these strings hold no special tokens but one).
            if !text.contains("<|endoftext|>") {
                assert_eq!(tok.decode(&got, false), text, "{model}: round trip");
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        for case in data["greedy_16"].as_array().unwrap() {
            let prompt = case["prompt"].as_str().unwrap();
            let want: Vec<u32> = common::ids(&case["prompt_ids_with_special"]);
            assert_eq!(
                tok.encode_prompt(prompt),
                want,
                "{model}: prompt {prompt:?}"
            );
        }
    }
}

/// A megabyte of anything tokenizes in well under two seconds on both models (each step
/// of the algorithm is linear or n log n), and a tokenization whose caller gives up stops
/// soon after.
#[test]
fn tokenization_is_linear_and_stops_when_cancelled() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    let prose = "The quick brown fox, 1234 naïve café 你好 <b>. ".repeat(30_000);
    for (model, _) in common::MODELS {
        let gguf = GgufFile::open(&common::model_path(model)).unwrap();
        let tok = Tokenizer::from_gguf(&gguf.meta).unwrap();
        for text in [
            "a".repeat(1 << 20),
            " ".repeat(1 << 20),
            "1".repeat(1 << 20),
            "<".repeat(1 << 20),
            prose.chars().take(1 << 20).collect(),
        ] {
            let started = Instant::now();
            let ids = tok.encode_prompt(&text);
            assert!(!ids.is_empty());
            let took = started.elapsed();
            assert!(
                took < Duration::from_secs(2),
                "{model}: {took:?} for {:?}…",
                &text[..1]
            );
        }
        // Eight megabytes of prose take about a second; cancelled after 20 ms, the work
        // stops within a few milliseconds of the flag.
        let long = prose.repeat(4);
        let cancelled = AtomicBool::new(false);
        let started = Instant::now();
        let result = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                cancelled.store(true, Ordering::Relaxed);
            });
            tok.encode_prompt_until(&long, &cancelled)
        });
        assert!(result.is_err(), "{model}: not cancelled");
        assert!(
            started.elapsed() < Duration::from_millis(300),
            "{model}: cancelled after {:?}",
            started.elapsed()
        );
    }
}
