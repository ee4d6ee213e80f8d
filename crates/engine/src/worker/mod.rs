//! The engine: a thread that takes sequences over a channel and runs one batched forward
//! step at a time over every running sequence (continuous batching). Three parts:
//!
//! - [`handle`]: the engine's API ([`EngineHandle`]), which checks a request once and queues it,
//!   and reads the engine's counters (`stats`);
//! - `queue`: the requests waiting for admission, their order (round robin over requests)
//!   and what leaves the queue before it runs (abandoned, late, aborted);
//! - `step_loop`: the thread's loop: commands in, admission within the scheduler's
//!   limits, one forward step, sampling, events out.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::lookup::PromptLookup;
use crate::model::Model;
use crate::scheduler::SchedulerConfig;
use crate::tokenizer::Tokenizer;
use crate::vision::VisionModel;

pub mod handle;
mod images;
mod queue;
mod stats;
mod step_loop;
#[cfg(test)]
mod tests;

use handle::Command;
pub use handle::{EngineHandle, StatsSnapshot};
use stats::EngineStats;

/// How the engine runs.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Admission and batching limits.
    pub scheduler: SchedulerConfig,
    /// Longest sequence (prompt plus completion) in tokens.
    pub context_length: usize,
    /// KV positions the prefix cache may keep from finished sequences (0: off).
    pub prefix_cache_positions: usize,
    /// Most requests (groups of sequences sharing a prompt) waiting for admission; past
    /// it, submissions fail with [`EngineError::Overloaded`](crate::error::EngineError::Overloaded).
    pub max_waiting: usize,
    /// Speculative decoding by prompt lookup, or `None` for off.
    pub prompt_lookup: Option<PromptLookup>,
    /// Longest a sequence may wait for its reader to catch up (`max_unread_events`
    /// behind); then it ends with [`SequenceEvent::TimedOut`](crate::sequence::SequenceEvent::TimedOut) and its KV cache and slot
    /// are freed.
    pub stalled_reader_timeout: Duration,
    /// Events a sequence's reader may leave unread before the sequence stops generating
    /// and waits for it (at least 1; [`crate::sequence::DEFAULT_MAX_UNREAD_EVENTS`]).
    pub max_unread_events: usize,
    /// Bytes of logits one step may compute for a prompt whose every position is scored
    /// (`prompt_logprobs`): such a prompt goes in as many positions a step as they hold,
    /// one at least ([`DEFAULT_SCORED_LOGITS_BYTES`]).
    pub scored_logits_bytes: usize,
    /// Longest shortest match a grammar's regex may have, in bytes; a grammar holding a
    /// longer one is refused before it compiles
    /// ([`crate::constrain::regexes::DEFAULT_MAX_REGEX_MATCH_BYTES`]).
    pub max_regex_match_bytes: usize,
}

/// Bytes of logits one step computes for a prompt whose every position is scored, unless
/// configured otherwise ([`EngineConfig::scored_logits_bytes`]): 16 rows of Gemma 3's
/// vocabulary, 85 of SmolLM2's.
pub const DEFAULT_SCORED_LOGITS_BYTES: usize = 16 << 20;

/// The running engine: its thread and a handle to it.
pub struct Engine {
    handle: EngineHandle,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    /// Starts the engine thread for `model`.
    pub fn start(model: Box<dyn Model>, tokenizer: Tokenizer, config: EngineConfig) -> Self {
        Self::start_with_vision(model, None, tokenizer, config)
    }

    /// Starts the engine thread for `model`, with `vision` to read the prompts' images.
    pub fn start_with_vision(
        mut model: Box<dyn Model>,
        vision: Option<Arc<VisionModel>>,
        tokenizer: Tokenizer,
        config: EngineConfig,
    ) -> Self {
        model.set_context_length(config.context_length);
        let (tx, rx) = mpsc::channel();
        let tokenizer = Arc::new(tokenizer);
        let stats = Arc::new(EngineStats::default());
        let info = model.info().clone();
        let kv_types = model.kv_types();
        let worker = step_loop::Worker::new(
            model,
            vision.clone(),
            Arc::clone(&tokenizer),
            config,
            Arc::clone(&stats),
        );
        let thread = std::thread::Builder::new()
            .name("ferrite-engine".into())
            .spawn(move || worker.run(rx))
            .expect("spawning the engine thread");
        let handle = EngineHandle::new(tx, tokenizer, info, config, stats, vision, kv_types);
        Self {
            handle,
            thread: Some(thread),
        }
    }

    /// A handle for submitting work.
    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// Aborts whatever is still queued or running and stops the thread.
    pub fn shutdown(mut self) {
        self.handle.close();
        self.handle.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
