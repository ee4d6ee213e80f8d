//! Chunked prefill changes nothing: a long prompt computed in chunks of 64, 200 or 512
//! tokens per step (`--max-step-tokens`), or alone in one step, gives the same greedy
//! tokens and bit-identical logprobs, on both models (Gemma's prompt rows round by how
//! llama-server would batch the prompt, which must not depend on ferrite's own chunks).

mod common;

use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::scheduler::SchedulerConfig;
use ferrite_engine::{EngineConfig, SequenceEvent, SequenceRequest};

/// Greedy tokens and their logprobs for `prompt`, on an engine whose steps take at most
/// `step_tokens` tokens.
fn run(name: &str, prompt: &str, step_tokens: usize) -> (Vec<u32>, Vec<u32>) {
    let engine = common::start_engine(
        name,
        EngineConfig {
            scheduler: SchedulerConfig {
                max_running: 4,
                max_step_tokens: step_tokens,
                kv_budget: 1 << 16,
            },
            context_length: 4096,
            prefix_cache_positions: 0,
            max_waiting: 8,
        },
    );
    let h = engine.handle();
    let ids = h.tokenizer().encode_prompt(prompt);
    let mut r = SequenceRequest::new(
        ids,
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        12,
    );
    r.ignore_eos = true;
    let mut rx = h.submit(r).unwrap();
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    while let Some(event) = rx.blocking_recv() {
        match event {
            SequenceEvent::Token { id, logprob, .. } => {
                tokens.push(id);
                logprobs.push(logprob.expect("token logprobs").to_bits());
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
