//! The prefix cache on real models: a long shared prefix re-sent with a new tail is served
//! from the cache (the engine's counters say how many prompt tokens were reused and how many
//! computed; no wall-clock ratio, which another test on the same cores would upset), and
//! the output is exactly what a cold run gives (Gemma's prompt rows round by how
//! llama-server batches them, so reuse must respect that).

mod common;

use std::time::{Duration, Instant};

use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::scheduler::SchedulerConfig;
use ferrite_engine::{Engine, EngineConfig, EngineHandle, SequenceEvent, SequenceRequest};

fn start(name: &str, prefix_cache_positions: usize) -> Engine {
    common::start_engine(
        name,
        EngineConfig {
            scheduler: SchedulerConfig {
                max_running: 8,
                ..common::config().scheduler
            },
            context_length: 4096,
            prefix_cache_positions,
            ..common::config()
        },
    )
}

/// Greedy run: time to the first token, and every token with its logprob.
fn run(h: &EngineHandle, prompt: &[u32]) -> (Duration, Vec<(u32, Option<f32>)>) {
    let mut r = SequenceRequest::new(
        prompt.to_vec(),
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        6,
    );
    r.ignore_eos = true;
    let started = Instant::now();
    let mut rx = h.submit(r).unwrap();
    let mut first = None;
    let mut tokens = Vec::new();
    while let Some(event) = rx.blocking_recv() {
        match event {
            SequenceEvent::Token { id, logprob, .. } => {
                first.get_or_insert_with(|| started.elapsed());
                tokens.push((id, logprob));
            }
            SequenceEvent::Finished { .. } => return (first.unwrap(), tokens),
            other => panic!("unexpected {other:?}"),
        }
    }
    panic!("no finish");
}

fn prompts(h: &EngineHandle, prefix_words: usize) -> (Vec<u32>, Vec<u32>) {
    let words = [
        "river", "stone", "garden", "lamp", "window", "cloud", "paper", "orange",
    ];
    let text: String = (0..prefix_words)
        .map(|i| format!("{} ", words[(i * 7 + i / 3) % words.len()]))
        .collect();
    let prefix = h.tokenizer().encode_prompt(&text);
    let tail = |t: &str| [prefix.clone(), h.tokenizer().encode(t, false)].concat();
    (
        tail("and then the first question was answered by the people of the valley, who"),
        tail("but the second story tells of a traveller who came from the north and said"),
    )
}

#[test]
fn smollm2_a_shared_prefix_is_not_computed_again_and_changes_nothing() {
    let engine = start("smollm2-135m", 8192);
    let h = engine.handle();
    let (first, second) = prompts(&h, 1000);
    assert!(first.len() > 1000, "{} tokens", first.len());
    let (cold, _) = run(&h, &first);
    let before = h.stats();
    let (warm, cached_output) = run(&h, &second);
    let after = h.stats();
    let reused = after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens;
    let computed = after.prompt_tokens - before.prompt_tokens;
    eprintln!(
        "{} prompt tokens: first token after {cold:?} cold, {warm:?} with {reused} cached",
        second.len()
    );
    // Counted, not timed: the shared prefix is served from the cache and only the new
    // tail runs through the model.
    let prefix = (0..first.len())
        .take_while(|&i| first[i] == second[i])
        .count();
    assert!(reused >= 1000, "{reused} positions reused");
    assert!(
        reused as usize <= prefix,
        "{reused} reused of a {prefix}-token prefix"
    );
    assert_eq!(reused + computed, second.len() as u64);
    assert!(computed < 64, "{computed} prompt tokens computed again");
    engine.shutdown();

    let cold_engine = start("smollm2-135m", 0);
    let (_, expected) = run(&cold_engine.handle(), &second);
    assert_eq!(cached_output, expected, "reuse changes nothing");
    cold_engine.shutdown();
}

#[test]
fn gemma3_reuse_gives_exactly_the_cold_output() {
    let engine = start("gemma3-270m", 8192);
    let h = engine.handle();
    let (first, second) = prompts(&h, 150);
    run(&h, &first);
    let before = h.stats().prefix_cache_hit_tokens;
    let (_, cached_output) = run(&h, &second);
    assert!(
        h.stats().prefix_cache_hit_tokens > before,
        "something was reused"
    );
    engine.shutdown();

    let cold_engine = start("gemma3-270m", 0);
    let (_, expected) = run(&cold_engine.handle(), &second);
    assert_eq!(cached_output, expected, "reuse changes nothing");
    cold_engine.shutdown();
}
