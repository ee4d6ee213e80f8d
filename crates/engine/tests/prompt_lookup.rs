//! Speculative decoding by prompt lookup on a real model: the same tokens and logprobs as
//! decoding without it, greedy, seeded, with alternatives and several sequences at once,
//! in fewer forward steps when the output repeats its input.

mod common;

use std::time::{Duration, Instant};

use ferrite_engine::lookup::PromptLookup;
use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::{Engine, EngineConfig, EngineHandle, SequenceEvent, SequenceRequest};

fn start(prompt_lookup: Option<PromptLookup>, prefix_cache_positions: usize) -> Engine {
    common::start_engine(
        "smollm2-135m",
        EngineConfig {
            prefix_cache_positions,
            prompt_lookup,
            ..common::config()
        },
    )
}

/// What one sequence sent: its tokens, their logprobs and alternatives.
type Outcome = Vec<(u32, Option<f32>, Vec<(u32, f32)>)>;

fn collect(mut rx: ferrite_engine::Events) -> Outcome {
    let mut out = Vec::new();
    while let Some(event) = rx.blocking_recv() {
        match event {
            SequenceEvent::Token {
                id, logprob, top, ..
            } => out.push((id, logprob, top)),
            SequenceEvent::Finished { .. } => return out,
            other => panic!("unexpected event {other:?}"),
        }
    }
    panic!("the engine dropped the sequence");
}

/// Waits until the engine has published the counters of its last step.
fn settle(h: &EngineHandle) {
    let started = Instant::now();
    while h.stats().running > 0 && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn request(
    h: &EngineHandle,
    text: &str,
    max_tokens: usize,
    sampling: SamplingParams,
) -> SequenceRequest {
    let mut r = SequenceRequest::new(h.tokenizer().encode_prompt(text), sampling, max_tokens);
    r.ignore_eos = true;
    r.top_logprobs = Some(2);
    r
}

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..Default::default()
    }
}

/// Runs `requests` together and returns each one's outcome and the steps they took.
fn run(h: &EngineHandle, requests: Vec<SequenceRequest>) -> (Vec<Outcome>, u64) {
    settle(h);
    let steps = h.stats().steps;
    let receivers: Vec<_> = requests.into_iter().map(|r| h.submit(r).unwrap()).collect();
    let outs = receivers.into_iter().map(collect).collect();
    settle(h);
    (outs, h.stats().steps - steps)
}

const QUOTE: &str = "Copy the sentence.\nSentence: The committee approved the new budget for \
    the library, the park and the two schools on Tuesday evening.\nCopy: The committee";

#[test]
fn prompt_lookup_changes_no_token_and_saves_steps() {
    let plain = start(None, 0);
    let fast = start(Some(PromptLookup::new(2, 4, 8).unwrap()), 0);
    let (p, f) = (plain.handle(), fast.handle());
    let cases: Vec<(&str, usize, SamplingParams)> = vec![
        (QUOTE, 48, greedy()),
        ("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,", 40, greedy()),
        (
            QUOTE,
            40,
            SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                seed: 7,
                ..Default::default()
            },
        ),
        // Ends inside a draft: the last step has room for fewer drafted tokens.
        (QUOTE, 5, greedy()),
    ];
    for (text, max_tokens, sampling) in &cases {
        let (want, plain_steps) = run(&p, vec![request(&p, text, *max_tokens, sampling.clone())]);
        let fed = f.stats().draft_tokens_fed;
        let accepted = f.stats().draft_tokens_accepted;
        let (got, fast_steps) = run(&f, vec![request(&f, text, *max_tokens, sampling.clone())]);
        assert_eq!(got, want, "{text:?}: tokens, logprobs and alternatives");
        let (fed, accepted) = (
            f.stats().draft_tokens_fed - fed,
            f.stats().draft_tokens_accepted - accepted,
        );
        eprintln!(
            "{max_tokens} tokens: {plain_steps} steps alone, {fast_steps} with lookup; \
             {accepted} of {fed} drafted tokens accepted"
        );
        assert!(accepted <= fed);
        if *max_tokens >= 40 {
            assert!(
                fast_steps * 3 <= plain_steps * 2,
                "{text:?}: {fast_steps} steps with lookup, {plain_steps} without"
            );
        }
    }
    // Several sequences at once (each drafts its own), and one of them seeded.
    let batch = |h: &EngineHandle| {
        cases
            .iter()
            .map(|(text, max_tokens, sampling)| request(h, text, *max_tokens, sampling.clone()))
            .collect::<Vec<_>>()
    };
    let (want, _) = run(&p, batch(&p));
    let (got, _) = run(&f, batch(&f));
    assert_eq!(got, want, "a batch of sequences");
    plain.shutdown();
    fast.shutdown();
}

/// A sequence that finishes on a token sampled inside a verified draft, where the draft
/// guessed another token, must leave in the prefix cache only the positions its own
/// tokens computed: a follow-up prompt that starts with its whole output (a
/// conversation's next turn) answers exactly as a cold run does. A prediction that
/// differs from the output at the stop token makes such a draft every time (prompt
/// lookup makes them as they come).
#[test]
fn a_sequence_that_ends_inside_a_draft_leaves_only_its_own_positions_cached() {
    let cold = start(None, 0);
    let cached = start(Some(PromptLookup::new(2, 4, 8).unwrap()), 8192);
    let (c, h) = (cold.handle(), cached.handle());
    let (copy, _) = run(&c, vec![request(&c, QUOTE, 8, greedy())]);
    let tokens: Vec<u32> = copy[0].iter().map(|(id, _, _)| *id).collect();
    let at = (2..tokens.len())
        .find(|&i| !tokens[..i].contains(&tokens[i]))
        .expect("a token that first appears a few tokens in");
    // The output up to the stop token, predicted with another token in its place.
    let mut first = request(&h, QUOTE, 8, greedy());
    first.stop_token_ids = vec![tokens[at]];
    first.prediction = tokens.clone();
    first.prediction[at] = tokens[at] + 1;
    let accepted = h.stats().draft_tokens_accepted;
    let (out, _) = run(&h, vec![first]);
    assert_eq!(out[0].len(), at + 1, "it stopped at the stop token");
    assert!(
        h.stats().draft_tokens_accepted - accepted >= at as u64 - 1,
        "the drafts ran"
    );
    // The next turn: the prompt, all of the output, and more text.
    let follow_up = |e: &EngineHandle| {
        let mut prompt = e.tokenizer().encode_prompt(QUOTE);
        prompt.extend(&tokens[..=at]);
        prompt.extend(e.tokenizer().encode(" Again:", false));
        let mut r = SequenceRequest::new(prompt, greedy(), 4);
        r.ignore_eos = true;
        r.top_logprobs = Some(2);
        r
    };
    let hits = h.stats().prefix_cache_hit_tokens;
    let (want, _) = run(&c, vec![follow_up(&c)]);
    let (got, _) = run(&h, vec![follow_up(&h)]);
    let prompt_len = h.tokenizer().encode_prompt(QUOTE).len();
    assert!(
        h.stats().prefix_cache_hit_tokens - hits >= (prompt_len + at) as u64,
        "the follow-up reused the first sequence's output from the prefix cache"
    );
    assert_eq!(got, want);
    cold.shutdown();
    cached.shutdown();
}
