//! Chunked prefill changes nothing: a long prompt computed in chunks of 64, 200 or 512
//! tokens per step (`--max-step-tokens`), or alone in one step, gives the same greedy
//! tokens and bit-identical logprobs, on both models (prompt rows round by how
//! llama-server would batch the prompt, which must not depend on ferrite's own chunks),
//! and llama.cpp's own greedy answer to long prompts.

mod common;

use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::scheduler::SchedulerConfig;
use ferrite_engine::{EngineConfig, SequenceEvent, SequenceRequest};

/// Greedy tokens and their logprobs for `prompt`, on an engine whose steps take at most
/// `step_tokens` tokens.
fn run(name: &str, prompt: &str, step_tokens: usize) -> (Vec<u32>, Vec<u32>) {
    let (tokens, logprobs) = run_ids(name, None, prompt, step_tokens, 12);
    (tokens, logprobs.iter().map(|l| l.to_bits()).collect())
}

/// Greedy tokens and their logprobs for `ids` (or `prompt` tokenized), `max_tokens` of
/// them.
fn run_ids(
    name: &str,
    ids: Option<Vec<u32>>,
    prompt: &str,
    step_tokens: usize,
    max_tokens: usize,
) -> (Vec<u32>, Vec<f32>) {
    let engine = common::start_engine(
        name,
        EngineConfig {
            scheduler: SchedulerConfig {
                max_running: 4,
                max_step_tokens: step_tokens,
                ..common::config().scheduler
            },
            context_length: 4096,
            max_waiting: 8,
            ..common::config()
        },
    );
    let h = engine.handle();
    let ids = ids.unwrap_or_else(|| h.tokenizer().encode_prompt(prompt));
    let mut r = SequenceRequest::new(
        ids,
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        max_tokens,
    );
    r.ignore_eos = true;
    let mut rx = h.submit(r).unwrap();
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    while let Some(event) = rx.blocking_recv() {
        match event {
            SequenceEvent::Token { id, logprob, .. } => {
                tokens.push(id);
                logprobs.push(logprob.expect("token logprobs"));
            }
            SequenceEvent::Finished { .. } => break,
            SequenceEvent::PromptLogprobs(_) => {}
            other => panic!("{other:?}"),
        }
    }
    engine.shutdown();
    (tokens, logprobs)
}

#[test]
fn chunked_prefill_gives_the_unchunked_answer() {
    let prompt = "The harbour town woke slowly. Fishermen hauled their nets past the old \
                  lighthouse, and the baker opened his shutters. "
        .repeat(30);
    for name in ["smollm2-135m", "gemma3-270m"] {
        let whole = run(name, &prompt, 2048);
        assert_eq!(whole.0.len(), 12);
        for step_tokens in [64, 200, 512] {
            assert_eq!(
                run(name, &prompt, step_tokens),
                whole,
                "{name}: prefill in chunks of {step_tokens} differs from one step"
            );
        }
    }
}

/// The same against llama.cpp: prompts of 600 and 1,200 tokens prefilled 100 tokens per
/// step give llama-server's greedy tokens, with logprobs within 1e-3 (llama.cpp computed
/// them in its own 512-token micro-batches; ferrite rounds each row as those would, its
/// tiled Q6_K kernel included: `fixtures/README.md`).
#[test]
fn chunked_prefill_gives_llama_cpps_answer() {
    for (name, file) in [
        ("smollm2-135m", "smollm2-135m-q4_1.llamacpp-long.json"),
        ("gemma3-270m", "gemma3-270m-q4_k_m.llamacpp-long.json"),
    ] {
        let data = common::fixture(file);
        for case in &data["greedy_16"].as_array().unwrap()[4..] {
            let ids = common::ids(&case["prompt_ids_with_special"]);
            let steps = case["steps"].as_array().unwrap();
            let n = ids.len();
            let (tokens, logprobs) = run_ids(name, Some(ids), "", 100, steps.len());
            for (i, step) in steps.iter().enumerate() {
                assert_eq!(
                    tokens[i] as u64,
                    step["id"].as_u64().unwrap(),
                    "{name}, {n}-token prompt, token {i}"
                );
                let want = step["logprob"].as_f64().unwrap() as f32;
                assert!(
                    (logprobs[i] - want).abs() <= 1e-3,
                    "{name}, {n}-token prompt, token {i}: logprob {} against llama.cpp's {want}",
                    logprobs[i]
                );
            }
        }
    }
}
