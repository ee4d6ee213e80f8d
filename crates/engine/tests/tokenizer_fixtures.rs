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

/// A megabyte of anything tokenizes in about four times a quarter megabyte's time on both
/// models (each step of the algorithm is linear or n log n; quadratic would be sixteen
/// times), and a tokenization whose caller gives up stops soon after.
#[test]
fn tokenization_is_linear_and_stops_when_cancelled() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    let prose = "The quick brown fox, 1234 naïve café 你好 <b>. ".repeat(30_000);
    for (model, _) in common::MODELS {
        let gguf = GgufFile::open(&common::model_path(model)).unwrap();
        let tok = Tokenizer::from_gguf(&gguf.meta).unwrap();
        let time = |text: &str| {
            let started = Instant::now();
            assert!(!tok.encode_prompt(text).is_empty());
            started.elapsed()
        };
        for text in [
            "a".repeat(1 << 20),
            " ".repeat(1 << 20),
            "1".repeat(1 << 20),
            "<".repeat(1 << 20),
            prose.chars().take(1 << 20).collect::<String>(),
        ] {
            let quarter: String = text.chars().take(1 << 18).collect();
            let (part, whole) = (time(&quarter), time(&text));
            // Linear is four times, quadratic sixteen. The slack is for a busy machine (the
            // binary's other tests run beside this one; an absolute bound of two seconds
            // failed on one at 2.4 s), and the absolute bound catches a stall.
            let at = format!(
                "{model}: {whole:?} for a megabyte of {:?}…, {part:?} for a quarter",
                &text[..1]
            );
            assert!(whole < part * 8 + Duration::from_millis(500), "{at}");
            assert!(whole < Duration::from_secs(10), "{at}");
            println!("{at}");
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
