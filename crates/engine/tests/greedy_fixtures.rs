//! Our forward pass reproduces llama.cpp's greedy continuations: all 16 tokens of every
//! fixture prompt, with the chosen token's log-probability within 1e-3 at every step (the
//! replays give at most 8e-4: the kernels follow llama.cpp's rounding, and where Gemma's
//! prompt rows round by how llama-server batches them, each fixture is replayed with its
//! own batching).

mod common;

use ferrite_engine::model::{self, PromptBatching};

const MIN_MATCHING: usize = 16;
const LOGPROB_TOLERANCE: f32 = 1e-3;

/// One fixture prompt replayed greedily: the step reached and the largest log-probability
/// difference on the way.
struct Replay {
    prompt: String,
    matched: usize,
    worst_logprob_diff: f32,
}

/// Replays the fixture's prompts greedily, rounding prompt rows as llama-server does with
/// `batching`.
fn replay(name: &str, data: &serde_json::Value, batching: PromptBatching) -> Vec<Replay> {
    let (_gguf, mut model) = model::load_path(&common::model_path(name)).unwrap();
    model.set_prompt_batching(batching);
    let mut out = Vec::new();
    for case in data["greedy_16"].as_array().unwrap() {
        let prompt: Vec<u32> = common::ids(&case["prompt_ids_with_special"]);
        let steps = case["steps"].as_array().unwrap();
        let replay = common::replay_greedy(model.as_ref(), &prompt, steps).unwrap();
        let (matched, worst) = (replay.matched, replay.worst_logprob_diff);
        let prompt = case["prompt"].as_str().unwrap().to_string();
        eprintln!(
            "{name} {prompt:?}: {matched}/{} tokens, worst logprob diff {worst:.4}",
            steps.len()
        );
        out.push(Replay {
            prompt,
            matched,
            worst_logprob_diff: worst,
        });
    }
    out
}

fn assert_tokens(name: &str, replays: &[Replay]) {
    assert!(!replays.is_empty());
    for r in replays {
        assert!(
            r.matched >= MIN_MATCHING,
            "{name} {:?}: only {} greedy tokens match llama.cpp",
            r.prompt,
            r.matched
        );
    }
}

fn assert_logprobs(name: &str, replays: &[Replay]) {
    for r in replays {
        assert!(
            r.worst_logprob_diff <= LOGPROB_TOLERANCE,
            "{name} {:?}: a matching step's logprob is {} away from llama.cpp's",
            r.prompt,
            r.worst_logprob_diff
        );
    }
}

#[test]
fn smollm2_greedy_tokens_and_logprobs_match_llama_cpp() {
    let replays = replay(
        "smollm2-135m",
        &common::fixture("smollm2-135m-q4_1.llamacpp.json"),
        PromptBatching::default(),
    );
    assert_tokens("smollm2-135m", &replays);
    assert_logprobs("smollm2-135m", &replays);
}

#[test]
fn gemma3_greedy_tokens_and_logprobs_match_llama_cpp() {
    let replays = replay(
        "gemma3-270m",
        &common::fixture("gemma3-270m-q4_k_m.llamacpp.json"),
        PromptBatching::default(),
    );
    assert_tokens("gemma3-270m", &replays);
    assert_logprobs("gemma3-270m", &replays);
}

/// llama.cpp's greedy run of the same prompts token by token (`-ub 1`), which rounds the
/// prompt rows differently; see `fixtures/README.md` for how it was made.
fn gemma3_token_by_token_reference() -> serde_json::Value {
    common::fixture("gemma3-270m-q4_k_m.llamacpp-ub1.json")
}

#[test]
fn gemma3_token_by_token_matches_llama_cpp_token_by_token() {
    let replays = replay(
        "gemma3-270m",
        &gemma3_token_by_token_reference(),
        PromptBatching::TOKEN_BY_TOKEN,
    );
    assert_tokens("gemma3-270m", &replays);
    assert_logprobs("gemma3-270m", &replays);
}

/// Prompts of 50 to 1,200 tokens, which llama-server computes in one to three 512-token
/// micro-batches (`fixtures/make_long.py`), against llama.cpp itself: micro-batches of 64
/// rows or more take llama.cpp's tiled attention, decode steps over 512 cells or more its
/// split attention, and ferrite follows both (`model/attention.rs`).
fn long_prompts(name: &str, file: &str) {
    let replays = replay(name, &common::fixture(file), PromptBatching::default());
    assert_eq!(replays.len(), 6);
    assert_tokens(name, &replays);
    assert_logprobs(name, &replays);
}

#[test]
fn smollm2_long_prompts_match_llama_cpp_across_its_batches() {
    long_prompts("smollm2-135m", "smollm2-135m-q4_1.llamacpp-long.json");
}

/// Gemma's long prompts against llama.cpp's defaults: from a micro-batch of 8 rows
/// llama.cpp multiplies the file's Q6_K weights with its tiled kernel (`ggml-cpu/tiled`),
/// which ferrite follows (`quant/q6k_lanes/tiled.rs`); without it the logprobs move by up
/// to 0.1.
#[test]
fn gemma3_long_prompts_match_llama_cpp_across_its_batches() {
    long_prompts("gemma3-270m", "gemma3-270m-q4_k_m.llamacpp-long.json");
}
