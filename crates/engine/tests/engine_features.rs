//! The engine's request features on a real model: shared prefill for groups, prompt
//! logprobs, predicted outputs as drafts, deadlines, stop tokens and `min_tokens`.

mod common;

use std::time::{Duration, Instant};

use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::scheduler::SchedulerConfig;
use ferrite_engine::{
    Engine, EngineConfig, EngineHandle, FinishReason, PromptLogprob, SequenceEvent, SequenceRequest,
};

fn start() -> Engine {
    common::start_engine("smollm2-135m", common::config())
}

/// Everything one sequence sent, gathered.
#[derive(Debug, Default)]
struct Outcome {
    tokens: Vec<u32>,
    logprobs: Vec<Option<f32>>,
    prompt: Option<Vec<PromptLogprob>>,
    finish: Option<FinishReason>,
    timed_out: bool,
}

/// Waits until the engine has finished its step and published its counters (a sequence's
/// last event is sent during the step, before the step's counters are added).
fn settle(h: &EngineHandle) {
    settle_to(h, 0);
}

fn collect(mut rx: ferrite_engine::Events) -> Outcome {
    let mut out = Outcome::default();
    while let Some(event) = rx.blocking_recv() {
        match event {
            SequenceEvent::Token { id, logprob, .. } => {
                out.tokens.push(id);
                out.logprobs.push(logprob);
            }
            SequenceEvent::PromptLogprobs(p) => out.prompt = Some(p),
            SequenceEvent::Finished { reason, .. } => {
                out.finish = Some(reason);
                return out;
            }
            SequenceEvent::TimedOut => {
                out.timed_out = true;
                return out;
            }
            SequenceEvent::Failed(m) => panic!("sequence failed: {m}"),
            SequenceEvent::Aborted => panic!("sequence aborted"),
        }
    }
    panic!("the engine dropped the sequence");
}

fn prompt(engine: &EngineHandle, text: &str) -> Vec<u32> {
    engine.tokenizer().encode_prompt(text)
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> SequenceRequest {
    let mut r = SequenceRequest::new(
        prompt,
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        max_tokens,
    );
    r.ignore_eos = true;
    r
}

#[test]
fn engine_features_on_smollm2() {
    let engine = start();
    let h = engine.handle();
    a_group_computes_its_prompt_once_and_matches_separate_runs(&h);
    prompt_logprobs_score_what_generation_produced(&h);
    a_prediction_saves_steps_and_changes_nothing(&h);
    a_passed_deadline_ends_the_sequence(&h);
    stop_tokens_end_and_min_tokens_hold_them_back(&h);
    engine.shutdown();
}

fn a_group_computes_its_prompt_once_and_matches_separate_runs(h: &EngineHandle) {
    let p = prompt(h, "The weather today is");
    let seeded = |seed| {
        let mut r = greedy(p.clone(), 12);
        r.sampling = SamplingParams {
            temperature: 0.9,
            seed,
            ..Default::default()
        };
        r
    };
    let alone: Vec<Vec<u32>> = (1..=3)
        .map(|s| collect(h.submit(seeded(s)).unwrap()).tokens)
        .collect();
    settle(h);
    let before = h.stats().prompt_tokens;
    let grouped: Vec<Vec<u32>> = h
        .submit_group((1..=3).map(seeded).collect())
        .unwrap()
        .into_iter()
        .map(|rx| collect(rx).tokens)
        .collect();
    settle(h);
    assert_eq!(grouped, alone, "a follower samples as it would alone");
    assert_eq!(
        h.stats().prompt_tokens - before,
        p.len() as u64,
        "the prompt ran once for three choices"
    );
    assert!(alone[0] != alone[1] || alone[1] != alone[2]);
}

fn prompt_logprobs_score_what_generation_produced(h: &EngineHandle) {
    let p = prompt(h, "One, two, three,");
    let generated = collect(h.submit(greedy(p.clone(), 6)).unwrap());
    assert!(generated.logprobs.iter().all(Option::is_some));
    // Without token logprobs asked for: the same tokens, and no pass over the vocabulary.
    let mut unscored = greedy(p.clone(), 6);
    unscored.token_logprobs = false;
    let unscored = collect(h.submit(unscored).unwrap());
    assert_eq!(unscored.tokens, generated.tokens);
    assert!(unscored.logprobs.iter().all(Option::is_none));
    let mut scored = greedy([p.clone(), generated.tokens.clone()].concat(), 0);
    scored.prompt_logprobs = Some(3);
    let out = collect(scored_request(h, scored));
    assert_eq!(out.finish, Some(FinishReason::Length));
    assert!(out.tokens.is_empty());
    let scores = out.prompt.expect("prompt logprobs");
    assert_eq!(scores.len(), p.len() + 6);
    assert_eq!(scores[0].logprob, None, "nothing predicts the first token");
    for (score, (&id, &lp)) in scores[p.len()..]
        .iter()
        .zip(generated.tokens.iter().zip(&generated.logprobs))
    {
        let lp = lp.expect("token logprobs are on by default");
        assert_eq!(score.id, id);
        // Greedy tokens are each position's most likely one.
        assert_eq!(score.top[0].0, id);
        assert_eq!(score.top.len(), 3);
        assert!(
            (score.logprob.unwrap() - lp).abs() < 1e-3,
            "{score:?} vs {lp}"
        );
    }
}

fn scored_request(h: &EngineHandle, r: SequenceRequest) -> ferrite_engine::Events {
    h.submit(r).unwrap()
}

fn a_prediction_saves_steps_and_changes_nothing(h: &EngineHandle) {
    let p = prompt(h, "def fibonacci(n):");
    let steps = h.stats().steps;
    let plain = collect(h.submit(greedy(p.clone(), 24)).unwrap());
    settle(h);
    let plain_steps = h.stats().steps - steps;
    let mut predicted = greedy(p.clone(), 24);
    predicted.prediction = plain.tokens.clone();
    let steps = h.stats().steps;
    let accepted = h.stats().draft_tokens_accepted;
    let fast = collect(h.submit(predicted).unwrap());
    settle(h);
    let fast_steps = h.stats().steps - steps;
    assert_eq!(fast.tokens, plain.tokens);
    assert_eq!(fast.logprobs, plain.logprobs, "identical arithmetic");
    assert!(
        fast_steps * 3 < plain_steps,
        "{fast_steps} steps with the prediction, {plain_steps} without"
    );
    assert!(h.stats().draft_tokens_accepted - accepted >= 20);
    // A wrong prediction costs nothing in output either.
    let mut wrong = greedy(p, 24);
    wrong.prediction = vec![42; 10];
    assert_eq!(collect(h.submit(wrong).unwrap()).tokens, plain.tokens);
}

fn a_passed_deadline_ends_the_sequence(h: &EngineHandle) {
    let mut r = greedy(prompt(h, "Tell me a long story"), 2000);
    r.deadline = Some(Instant::now() + Duration::from_millis(300));
    let started = Instant::now();
    let out = collect(h.submit(r).unwrap());
    assert!(out.timed_out);
    assert!(started.elapsed() < Duration::from_secs(5));
    settle(h);
    assert!(h.stats().timed_out >= 1);
}

fn stop_tokens_end_and_min_tokens_hold_them_back(h: &EngineHandle) {
    let p = prompt(h, "The capital of France is");
    let free = collect(h.submit(greedy(p.clone(), 8)).unwrap());
    let second = free.tokens[1];
    let mut r = greedy(p.clone(), 8);
    r.stop_token_ids = vec![second];
    let out = collect(h.submit(r).unwrap());
    assert_eq!(out.tokens, free.tokens[..2]);
    assert_eq!(out.finish, Some(FinishReason::StopToken(second)));
    // min_tokens 4: the stop token cannot come among the first four tokens, even with a
    // logit bias that makes it the choice at every step (the ban comes after the bias); the
    // fifth token is then the stop token, and ends the choice.
    let mut r = greedy(p, 8);
    r.stop_token_ids = vec![second];
    r.sampling.logit_bias = vec![(second, 100.0)];
    r.min_tokens = 4;
    let out = collect(h.submit(r).unwrap());
    assert_eq!(out.tokens.len(), 5, "{:?}", out.tokens);
    assert!(!out.tokens[..4].contains(&second));
    assert_eq!(out.tokens[4], second);
    assert_eq!(out.finish, Some(FinishReason::StopToken(second)));
    // And end-of-generation tokens likewise: forced by a bias, banned until min_tokens.
    let eos = h.tokenizer().end_of_generation()[0];
    let mut r = greedy(prompt(h, "The capital of France is"), 8);
    r.ignore_eos = false;
    r.sampling.logit_bias = vec![(eos, 100.0)];
    r.min_tokens = 3;
    let out = collect(h.submit(r).unwrap());
    assert_eq!(out.tokens.len(), 4, "{:?}", out.tokens);
    assert_eq!(out.finish, Some(FinishReason::EndOfSequence(eos)));
}

/// The waiting queue is bounded, `abort_all` ends everything with `Aborted` and frees
/// the queue, and a closed engine refuses new work.
#[test]
fn a_full_queue_refuses_and_abort_ends_everything() {
    let engine = common::start_engine(
        "smollm2-135m",
        EngineConfig {
            scheduler: SchedulerConfig {
                max_running: 1,
                ..common::config().scheduler
            },
            max_waiting: 2,
            ..common::config()
        },
    );
    let h = engine.handle();
    let long = |h: &EngineHandle| {
        let mut r = greedy(prompt(h, "1, 2, 3,"), 1500);
        r.ignore_eos = true;
        r
    };
    let running = h.submit(long(&h)).unwrap();
    let started = Instant::now();
    while h.stats().running == 0 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(h.stats().running, 1);
    let queued: Vec<_> = (0..2).map(|_| h.submit(long(&h)).unwrap()).collect();
    assert_eq!(h.stats().queued, 2);
    match h.submit(long(&h)) {
        Err(ferrite_engine::EngineError::Overloaded(2)) => {}
        other => panic!("expected Overloaded(2), got {:?}", other.map(|_| ())),
    }
    h.abort_all();
    for mut rx in std::iter::once(running).chain(queued) {
        let last = std::iter::from_fn(|| rx.blocking_recv()).last();
        assert_eq!(last, Some(SequenceEvent::Aborted));
    }
    assert_eq!(h.stats().queued, 0);
    let short = collect(h.submit(greedy(prompt(&h, "Hello"), 2)).unwrap());
    assert_eq!(short.tokens.len(), 2, "the engine runs on after an abort");
    h.close();
    assert!(matches!(
        h.submit(greedy(prompt(&h, "Hello"), 2)),
        Err(ferrite_engine::EngineError::Stopped)
    ));
    engine.shutdown();
}

/// The engine's two per-sequence bounds follow its configuration: a reader that reads
/// nothing holds its sequence at `max_unread_events` tokens while another runs on, and a
/// scored prompt goes in as many positions a step as `scored_logits_bytes` of logits hold
/// (here one), scoring exactly as in one piece.
#[test]
fn unread_events_and_scored_logits_follow_the_configuration() {
    let engine = common::start_engine(
        "smollm2-135m",
        EngineConfig {
            max_unread_events: 3,
            scored_logits_bytes: 1,
            ..common::config()
        },
    );
    let h = engine.handle();
    // The stalled reader: 40 tokens asked for, nothing read while the other runs.
    let stalled = h
        .submit(greedy(prompt(&h, "Once upon a time"), 40))
        .unwrap();
    let before = h.stats().generated_tokens;
    let clock = collect(h.submit(greedy(prompt(&h, "1, 2, 3,"), 30)).unwrap());
    assert_eq!(clock.tokens.len(), 30);
    settle_to(&h, 1);
    assert_eq!(h.stats().running, 1, "the stalled sequence alone runs");
    let stalled_tokens = h.stats().generated_tokens - before - 30;
    assert!(
        stalled_tokens <= 4,
        "{stalled_tokens} tokens generated for a reader 3 events may wait for"
    );
    let rest = collect(stalled);
    assert_eq!(rest.tokens.len(), 40, "reading lets it finish");

    let p = prompt(&h, "One, two, three, four, five, six, seven, eight");
    settle(&h);
    let steps = h.stats().steps;
    let mut scored = greedy(p.clone(), 0);
    scored.prompt_logprobs = Some(1);
    let out = collect(h.submit(scored).unwrap());
    assert_eq!(out.prompt.map(|s| s.len()), Some(p.len()));
    // The step that sent the last event counts itself after sending it.
    settle(&h);
    assert!(
        h.stats().steps - steps >= p.len() as u64,
        "{} positions went in {} steps",
        p.len(),
        h.stats().steps - steps
    );
    prompt_logprobs_score_what_generation_produced(&h);
    engine.shutdown();
}

/// Waits (5 s at most) until only `n` sequences run: the step that sent a finished
/// sequence's last event has then added its counters too (they are added during the step,
/// the running count published after it).
fn settle_to(h: &EngineHandle, n: usize) {
    let started = Instant::now();
    while h.stats().running > n && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
}
