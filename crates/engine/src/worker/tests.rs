//! The engine loop's own tests: the waiting queue's order and what leaves it, and the
//! loop's admission within the KV budget and its cancellation, on a tiny random-weight
//! model written by `ferrite-synth` (one layer, 128 wide, SmolLM2's tokenizer).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_synth::{write_model, Arch, Shape, Spec, WeightType};

use super::queue::{Pending, QueueSlot, WaitQueue};
use super::stats::EngineStats;
use super::{Engine, EngineConfig, EngineHandle};
use crate::sampling::SamplingParams;
use crate::scheduler::SchedulerConfig;
use crate::sequence::{self, Events, SequenceEvent, SequenceRequest};
use crate::tokenizer::Tokenizer;

/// A waiting group of `sequences` sequences for submission `slot`, and their receivers.
fn group(slot: &Arc<QueueSlot>, sequences: usize) -> (Pending, Vec<Events>) {
    let mut receivers = Vec::new();
    let mut members: Vec<_> = (0..sequences)
        .map(|_| {
            let (tx, rx) = sequence::channel(8);
            receivers.push(rx);
            (
                SequenceRequest::new(vec![1, 2, 3], SamplingParams::default(), 4),
                tx,
            )
        })
        .collect();
    let (request, events) = members.remove(0);
    let pending = Pending {
        request: Box::new(request),
        events,
        followers: members,
        slot: Arc::clone(slot),
    };
    (pending, receivers)
}

/// A submission's place, counted as the handle counts it.
fn slot(stats: &Arc<EngineStats>) -> Arc<QueueSlot> {
    stats.queued.fetch_add(1, Ordering::AcqRel);
    QueueSlot::new(Arc::clone(stats))
}

#[test]
fn admission_takes_the_waiting_requests_groups_in_turn() {
    let stats = Arc::new(EngineStats::default());
    let (a, b, c) = (slot(&stats), slot(&stats), slot(&stats));
    let mut queue = WaitQueue::default();
    let mut keep = Vec::new();
    // Request a has three prompts, b one, c two, queued in that order.
    for s in [&a, &a, &a, &b, &c, &c] {
        let (pending, rx) = group(s, 1);
        queue.push(pending);
        keep.push(rx);
    }
    // a's first, b's, c's first, then a's second, c's second, a's third.
    assert_eq!(queue.admission_order(), [0, 3, 4, 1, 5, 2]);
    let taken = queue.take([3, 0]);
    assert_eq!(taken[0].slot.request, b.request, "taken in the order asked");
    assert_eq!(queue.admission_order(), [0, 2, 1, 3], "a, c, a, c");
}

#[test]
fn the_queue_drops_groups_whose_clients_left_and_counts_a_request_until_its_last_group() {
    let stats = Arc::new(EngineStats::default());
    let (a, b) = (slot(&stats), slot(&stats));
    let mut queue = WaitQueue::default();
    let (first, rx_first) = group(&a, 2);
    let (second, rx_second) = group(&a, 1);
    let (other, _rx_other) = group(&b, 1);
    queue.push(first);
    queue.push(second);
    queue.push(other);
    drop((a, b));
    // One of two sequences gone: the group stays; both gone: it leaves.
    let [one, two]: [Events; 2] = rx_first.try_into().ok().unwrap();
    drop(one);
    assert_eq!(queue.drop_abandoned(), 0);
    drop(two);
    assert_eq!(queue.drop_abandoned(), 1);
    assert_eq!(
        stats.queued.load(Ordering::Acquire),
        2,
        "a still has a group waiting"
    );
    drop(rx_second);
    assert_eq!(queue.drop_abandoned(), 1);
    assert_eq!(
        stats.queued.load(Ordering::Acquire),
        1,
        "a left the queue's count"
    );
    assert_eq!(queue.len(), 1);
}

/// An engine on the tiny model with `config`.
fn start(config: EngineConfig) -> Engine {
    let spec = Spec {
        shape: Shape {
            hidden: 128,
            layers: 1,
            heads: 2,
            kv_heads: 1,
            head_dim: 64,
            ffn: 256,
        },
        ..Spec::small(Arch::Llama, WeightType::F32)
    };
    let home = crate::test_home();
    static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = FILES.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("ferrite-worker-{}-{n}.gguf", std::process::id()));
    write_model(&spec, &home.join("models/smollm2-135m.gguf"), &path).unwrap();
    let loaded = crate::model::load_path(&path);
    std::fs::remove_file(&path).unwrap();
    let (gguf, model) = loaded.unwrap();
    Engine::start(model, Tokenizer::from_gguf(&gguf.meta).unwrap(), config)
}

/// Settings for these tests: `kv_budget` positions, the rest generous.
fn config(kv_budget: usize) -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            max_running: 8,
            max_step_tokens: 256,
            kv_budget,
        },
        context_length: 512,
        prefix_cache_positions: 0,
        max_waiting: 64,
        prompt_lookup: None,
        stalled_reader_timeout: Duration::from_secs(60),
        max_unread_events: 256,
        scored_logits_bytes: super::DEFAULT_SCORED_LOGITS_BYTES,
        max_regex_match_bytes: crate::constrain::regexes::DEFAULT_MAX_REGEX_MATCH_BYTES,
    }
}

/// A greedy request of `max_tokens` tokens that ignores end-of-generation.
fn request(max_tokens: usize) -> SequenceRequest {
    let sampling = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let mut r = SequenceRequest::new(vec![1, 504, 3575, 282, 4649], sampling, max_tokens);
    r.ignore_eos = true;
    r
}

/// Waits (up to a minute) until `done` holds for the handle's counters.
fn wait_for(h: &EngineHandle, what: &str, done: impl Fn(&super::StatsSnapshot) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done(&h.stats()) {
        assert!(Instant::now() < deadline, "{what}: {:?}", h.stats());
        std::thread::yield_now();
    }
}

#[test]
fn sequences_that_do_not_fit_the_kv_budget_together_run_one_after_the_other() {
    // Each needs 5 + 60 = 65 positions; the budget holds one of them. Two unread events at
    // most: the engine cannot run far ahead of this reader, nor the second far at all.
    let engine = start(EngineConfig {
        max_unread_events: 2,
        ..config(100)
    });
    let h = engine.handle();
    let mut first = h.submit(request(60)).unwrap();
    let mut second = h.submit(request(60)).unwrap();
    let mut tokens = 0;
    while let Some(event) = first.blocking_recv() {
        match event {
            SequenceEvent::Token { .. } => tokens += 1,
            SequenceEvent::Finished { .. } => break,
            other => panic!("{other:?}"),
        }
        let s = h.stats();
        assert!(
            s.running <= 1 && s.kv_reserved <= 100,
            "token {tokens}: {s:?}"
        );
        // From its second token on the other request has long been submitted, and until
        // its last few this one is still running: the other waits.
        if (2..=56).contains(&tokens) {
            assert_eq!((s.running, s.queued), (1, 1), "token {tokens}: {s:?}");
        }
    }
    assert_eq!(tokens, 60);
    let mut later = 0;
    while let Some(SequenceEvent::Token { .. }) = second.blocking_recv() {
        later += 1;
    }
    assert_eq!(later, 60, "the second runs once the first is done");
    engine.shutdown();
}

#[test]
fn a_sequence_whose_client_leaves_is_dropped_at_the_next_step() {
    // Each needs 405 positions: one at a time.
    let engine = start(config(500));
    let h = engine.handle();
    let mut events = h.submit(request(400)).unwrap();
    assert!(matches!(
        events.blocking_recv(),
        Some(SequenceEvent::Token { .. })
    ));
    drop(events);
    wait_for(&h, "the sequence is dropped", |s| {
        s.abandoned == 1 && s.running == 0
    });
    assert!(
        h.stats().generated_tokens < 400,
        "it did not run to its end"
    );
    // A group still waiting goes the same way.
    let running = h.submit(request(400)).unwrap();
    let waiting = h.submit(request(400)).unwrap();
    wait_for(&h, "one runs, one waits", |s| {
        s.running == 1 && s.queued == 1
    });
    drop(waiting);
    wait_for(&h, "the waiting one is dropped", |s| {
        s.abandoned == 2 && s.queued == 0
    });
    drop(running);
    engine.shutdown();
}

#[test]
fn the_handle_checks_a_request_once_and_names_the_field() {
    let engine = start(config(4096));
    let h = engine.handle();
    let vocab = h.info().vocab_size as u32;
    let field = |r: &SequenceRequest| match h.check(r) {
        Err(crate::error::EngineError::InvalidRequest { field, message }) => {
            assert!(!message.is_empty());
            field
        }
        other => panic!("{other:?}"),
    };
    let mut r = request(4);
    r.prompt.clear();
    assert_eq!(field(&r), "prompt");
    let mut r = request(4);
    r.prompt.push(vocab);
    assert_eq!(field(&r), "prompt");
    let mut r = request(4);
    r.prompt = vec![1; 512];
    assert_eq!(field(&r), "prompt", "as long as the context");
    let mut r = request(4);
    r.stop_token_ids = vec![vocab + 5];
    assert_eq!(field(&r), "stop_token_ids");
    let mut r = request(4);
    r.prediction = vec![3, vocab];
    assert_eq!(field(&r), "prediction");
    let mut r = request(4);
    r.sampling.logit_bias = vec![(vocab, 1.0)];
    assert_eq!(field(&r), "logit_bias");
    let mut r = request(4);
    r.allowed_tokens = Some(vec![5, vocab].into());
    assert_eq!(field(&r), "allowed_token_ids");
    // Submitting checks the same, once per shared list of allowed tokens.
    match h.submit_group(vec![r.clone(), r]) {
        Err(crate::error::EngineError::InvalidRequest { field, .. }) => {
            assert_eq!(field, "allowed_token_ids")
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(h.check(&request(4)).is_ok());
    assert!(h.check_prompt(&[1, 2, 3]).is_ok());
    engine.shutdown();
}
