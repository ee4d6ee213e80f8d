//! The engine thread: takes sequences over a channel and runs one batched forward step
//! at a time over every running sequence (continuous batching).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::model::{BatchEntry, Model, ModelInfo};
use crate::scheduler::{self, RunningView, SchedulerConfig};
use crate::sequence::{Sequence, SequenceEvent, SequenceRequest};
use crate::tokenizer::Tokenizer;
use crate::EngineError;

/// How the engine runs.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Admission and batching limits.
    pub scheduler: SchedulerConfig,
    /// Longest sequence (prompt plus completion) in tokens.
    pub context_length: usize,
}

/// Counters the engine keeps up to date, for metrics and tests.
#[derive(Debug, Default)]
pub struct EngineStats {
    running: AtomicUsize,
    waiting: AtomicUsize,
    steps: AtomicU64,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    finished: AtomicU64,
    abandoned: AtomicU64,
}

/// A copy of the engine's counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Sequences in the running batch.
    pub running: usize,
    /// Sequences waiting for admission.
    pub waiting: usize,
    /// Forward steps run.
    pub steps: u64,
    /// Prompt tokens run through the model.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Sequences that finished normally.
    pub finished: u64,
    /// Sequences dropped because their receiver went away.
    pub abandoned: u64,
}

enum Command {
    Submit(Box<SequenceRequest>, UnboundedSender<SequenceEvent>),
    Shutdown,
}

/// A cheap, cloneable way to submit work to the engine.
#[derive(Clone)]
pub struct EngineHandle {
    commands: Sender<Command>,
    tokenizer: Arc<Tokenizer>,
    info: ModelInfo,
    config: EngineConfig,
    stats: Arc<EngineStats>,
}

impl EngineHandle {
    /// Queues one sequence; its events arrive on the returned receiver. Dropping the
    /// receiver cancels the sequence at the next step.
    pub fn submit(
        &self,
        request: SequenceRequest,
    ) -> Result<UnboundedReceiver<SequenceEvent>, EngineError> {
        self.check(&request)?;
        let (tx, rx) = unbounded_channel();
        self.commands
            .send(Command::Submit(Box::new(request), tx))
            .map_err(|_| EngineError::Stopped)?;
        Ok(rx)
    }

    fn check(&self, request: &SequenceRequest) -> Result<(), EngineError> {
        if request.prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        let vocab = self.info.vocab_size as u32;
        if let Some(bad) = request.prompt.iter().find(|&&t| t >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is out of the vocabulary (0..{vocab})"
            )));
        }
        if request.prompt.len() >= self.config.context_length {
            return Err(EngineError::InvalidRequest(format!(
                "the prompt has {} tokens; this model's context is {}",
                request.prompt.len(),
                self.config.context_length
            )));
        }
        if request.max_tokens == 0 {
            return Err(EngineError::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Facts about the loaded model.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Longest sequence (prompt plus completion) the engine runs.
    pub fn context_length(&self) -> usize {
        self.config.context_length
    }

    /// The engine's counters now.
    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.stats;
        StatsSnapshot {
            running: s.running.load(Ordering::Relaxed),
            waiting: s.waiting.load(Ordering::Relaxed),
            steps: s.steps.load(Ordering::Relaxed),
            prompt_tokens: s.prompt_tokens.load(Ordering::Relaxed),
            generated_tokens: s.generated_tokens.load(Ordering::Relaxed),
            finished: s.finished.load(Ordering::Relaxed),
            abandoned: s.abandoned.load(Ordering::Relaxed),
        }
    }
}

/// The running engine: its thread and a handle to it.
pub struct Engine {
    handle: EngineHandle,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    /// Starts the engine thread for `model`.
    pub fn start(model: Box<dyn Model>, tokenizer: Tokenizer, config: EngineConfig) -> Self {
        let (tx, rx) = mpsc::channel();
        let tokenizer = Arc::new(tokenizer);
        let stats = Arc::new(EngineStats::default());
        let info = model.info().clone();
        let worker = Worker {
            model,
            tokenizer: Arc::clone(&tokenizer),
            config,
            stats: Arc::clone(&stats),
            waiting: VecDeque::new(),
            running: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("ferrite-engine".into())
            .spawn(move || worker.run(rx))
            .expect("spawning the engine thread");
        let handle = EngineHandle {
            commands: tx,
            tokenizer,
            info,
            config,
            stats,
        };
        Self {
            handle,
            thread: Some(thread),
        }
    }

    /// A handle for submitting work.
    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// Fails whatever is still queued or running and stops the thread.
    pub fn shutdown(mut self) {
        let _ = self.handle.commands.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Worker {
    model: Box<dyn Model>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    stats: Arc<EngineStats>,
    waiting: VecDeque<(Box<SequenceRequest>, UnboundedSender<SequenceEvent>)>,
    running: Vec<Sequence>,
}

impl Worker {
    fn run(mut self, commands: Receiver<Command>) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                match commands.recv() {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            return;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        if self.running.is_empty() && self.waiting.is_empty() {
                            return;
                        }
                        break;
                    }
                }
            }
            self.drop_abandoned();
            self.admit();
            self.step();
            self.publish_counts();
        }
    }

    /// Handles one command; false means stop.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit(request, events) => {
                self.waiting.push_back((request, events));
                true
            }
            Command::Shutdown => {
                for (_, events) in self.waiting.drain(..) {
                    let _ =
                        events.send(SequenceEvent::Failed("the server is shutting down".into()));
                }
                for seq in &mut self.running {
                    seq.fail("the server is shutting down".into());
                }
                self.running.clear();
                self.publish_counts();
                false
            }
        }
    }

    fn drop_abandoned(&mut self) {
        let before = self.running.len() + self.waiting.len();
        self.running.retain(|s| !s.is_abandoned());
        self.waiting.retain(|(_, events)| !events.is_closed());
        let dropped = before - self.running.len() - self.waiting.len();
        if dropped > 0 {
            self.stats
                .abandoned
                .fetch_add(dropped as u64, Ordering::Relaxed);
            tracing::debug!(dropped, "dropped sequences whose clients went away");
        }
    }

    fn admit(&mut self) {
        let reserved: usize = self.running.iter().map(Sequence::reservation).sum();
        let needs: Vec<usize> = self
            .waiting
            .iter()
            .map(|(r, _)| r.prompt.len() + r.max_tokens)
            .collect();
        let n = scheduler::admit(&self.config.scheduler, self.running.len(), reserved, &needs);
        for (request, events) in self.waiting.drain(..n) {
            let capacity =
                (request.prompt.len() + request.max_tokens).min(self.config.context_length);
            let cache = self.model.new_cache(capacity);
            self.running.push(Sequence::new(*request, cache, events));
        }
    }

    fn step(&mut self) {
        if self.running.is_empty() {
            return;
        }
        let views: Vec<RunningView> = self
            .running
            .iter()
            .map(|s| RunningView {
                pending_prefill: s.pending_prefill(),
            })
            .collect();
        let plan = scheduler::plan_step(&self.config.scheduler, &views);
        let prefill_tokens: usize = views
            .iter()
            .zip(&plan)
            .filter(|(v, _)| v.pending_prefill > 0)
            .map(|(_, n)| n)
            .sum();
        let outcome = catch_unwind(AssertUnwindSafe(|| self.forward_and_sample(&plan)));
        match outcome {
            Ok(Ok(finished)) => {
                let mut i = 0;
                self.running.retain(|_| {
                    let keep = !finished[i];
                    i += 1;
                    keep
                });
                let done = finished.iter().filter(|&&f| f).count() as u64;
                self.stats.finished.fetch_add(done, Ordering::Relaxed);
            }
            Ok(Err(e)) => self.fail_all(&format!("inference failed: {e}")),
            Err(_) => self.fail_all("inference failed: internal error"),
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        self.stats
            .prompt_tokens
            .fetch_add(prefill_tokens as u64, Ordering::Relaxed);
    }

    /// Runs one forward step with `plan[i]` tokens of running sequence i, samples where a
    /// sequence has reached its last token, and returns which sequences finished.
    fn forward_and_sample(&mut self, plan: &[usize]) -> Result<Vec<bool>, EngineError> {
        let mut entries = Vec::new();
        let mut sampled = Vec::new();
        for (i, (seq, &n)) in self.running.iter_mut().zip(plan).enumerate() {
            if n == 0 {
                continue;
            }
            let start = seq.cache.len();
            let want_logits = start + n == seq.tokens.len();
            if want_logits {
                sampled.push(i);
            }
            entries.push(BatchEntry {
                tokens: &seq.tokens[start..start + n],
                cache: &mut seq.cache,
                want_logits,
                prompt_len: seq.prompt_len,
            });
        }
        let logits = self.model.forward(&mut entries)?;
        drop(entries);
        let mut finished = vec![false; self.running.len()];
        for (row, i) in logits.iter().zip(sampled) {
            let seq = &mut self.running[i];
            finished[i] = seq.accept_logits(row, &self.tokenizer, self.config.context_length);
            self.stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
        }
        Ok(finished)
    }

    fn fail_all(&mut self, message: &str) {
        tracing::error!(
            message,
            sequences = self.running.len(),
            "failing the running batch"
        );
        for seq in &mut self.running {
            seq.fail(message.to_string());
        }
        self.running.clear();
    }

    fn publish_counts(&self) {
        self.stats
            .running
            .store(self.running.len(), Ordering::Relaxed);
        self.stats
            .waiting
            .store(self.waiting.len(), Ordering::Relaxed);
    }
}
