//! The engine thread: takes sequences over a channel and runs one batched forward step
//! at a time over every running sequence (continuous batching).

use std::collections::{HashMap, HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::constrain::{Constraint, ConstraintFactory, Grammar};
use crate::error::EngineError;
use crate::lookup::PromptLookup;
use crate::model::{BatchEntry, Logits, Model, ModelInfo};
use crate::prefix_cache::PrefixCache;
use crate::running::{Followers, Sequence};
use crate::scheduler::{self, RunningView, SchedulerConfig, WaitingView};
use crate::sequence::{self, EventSender, Events, SequenceEvent, SequenceRequest};
use crate::tokenizer::Tokenizer;

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
    /// it, submissions fail with [`EngineError::Overloaded`].
    pub max_waiting: usize,
    /// Speculative decoding by prompt lookup, or `None` for off.
    pub prompt_lookup: Option<PromptLookup>,
    /// Longest a sequence may wait for its reader to catch up (`max_unread_events`
    /// behind); then it ends with [`SequenceEvent::TimedOut`] and its KV cache and slot
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

/// Counters the engine keeps up to date, for metrics and tests.
#[derive(Debug, Default)]
pub struct EngineStats {
    running: AtomicUsize,
    /// Requests submitted with a group not yet admitted or dropped (in the channel or
    /// waiting); one request counts once however many prompt groups it has.
    queued: AtomicUsize,
    kv_reserved: AtomicUsize,
    steps: AtomicU64,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    finished: AtomicU64,
    abandoned: AtomicU64,
    timed_out: AtomicU64,
    draft_tokens_accepted: AtomicU64,
    draft_tokens_fed: AtomicU64,
    prefix_cache_hit_tokens: AtomicU64,
}

/// A copy of the engine's counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Sequences in the running batch.
    pub running: usize,
    /// Requests submitted with a prompt group not yet admitted (one count per request,
    /// however many prompts it has).
    pub queued: usize,
    /// KV cache positions the running sequences reserve.
    pub kv_reserved: usize,
    /// KV cache positions they may reserve together.
    pub kv_budget: usize,
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
    /// Sequences ended by their deadline.
    pub timed_out: u64,
    /// Draft tokens (predicted, forced by a grammar, or found by prompt lookup) accepted:
    /// generated without a forward step of their own.
    pub draft_tokens_accepted: u64,
    /// Draft tokens fed to forward steps for verification, accepted or not.
    pub draft_tokens_fed: u64,
    /// Prompt tokens whose keys and values came from the prefix cache.
    pub prefix_cache_hit_tokens: u64,
}

/// A request waiting for admission: its first sequence and the choices that share its
/// prompt.
struct Pending {
    request: Box<SequenceRequest>,
    events: EventSender,
    followers: Followers,
    /// The submission this group belongs to, shared by its groups: it counts once in
    /// the waiting queue's bound, until its last group leaves the queue.
    slot: Arc<QueueSlot>,
}

/// One submission's place in the waiting queue's count: dropped with the last of its
/// groups to leave the queue (admitted, abandoned, late, aborted, or never delivered).
struct QueueSlot {
    stats: Arc<EngineStats>,
    /// The submission's number, which its sequences carry while they run.
    request: u64,
}

/// Numbers submissions ([`QueueSlot::request`]).
static NEXT_REQUEST: AtomicU64 = AtomicU64::new(0);

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.stats.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Pending {
    fn view(&self) -> WaitingView {
        WaitingView {
            need: self.request.kv_need()
                + self
                    .followers
                    .iter()
                    .map(|(r, _)| r.kv_need())
                    .sum::<usize>(),
            sequences: 1 + self.followers.len(),
            request: self.slot.request,
        }
    }

    fn is_abandoned(&self) -> bool {
        self.events.is_closed() && self.followers.iter().all(|(_, e)| e.is_closed())
    }

    fn is_late(&self, now: Instant) -> bool {
        self.request.deadline.is_some_and(|d| now >= d)
    }

    /// Sends `event` to every sequence of the request.
    fn end(self, event: SequenceEvent) {
        for (_, events) in &self.followers {
            events.send(event.clone());
        }
        self.events.send(event);
    }
}

enum Command {
    Submit(Pending),
    /// End everything queued or running with [`SequenceEvent::Aborted`]; keep running.
    Abort,
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
    constraints: Arc<OnceLock<Result<ConstraintFactory, String>>>,
    closed: Arc<AtomicBool>,
}

impl EngineHandle {
    /// Compiles a grammar for one sequence (clone the result for more). The error is the
    /// grammar compiler's message. The vocabulary is indexed for grammars on first use.
    pub fn compile_grammar(&self, grammar: &Grammar) -> Result<Constraint, String> {
        let factory = self.constraints.get_or_init(|| {
            ConstraintFactory::new(
                Arc::clone(&self.tokenizer),
                self.config.max_regex_match_bytes,
            )
            .map_err(|e| e.to_string())
        });
        match factory {
            Ok(factory) => factory.compile(grammar),
            Err(e) => Err(format!(
                "structured output is unavailable for this model: {e}"
            )),
        }
    }

    /// Queues one sequence; its events arrive on the returned receiver. Dropping the
    /// receiver cancels the sequence at the next step.
    pub fn submit(&self, request: SequenceRequest) -> Result<Events, EngineError> {
        Ok(self.submit_group(vec![request])?.remove(0))
    }

    /// Queues sequences that share one prompt (the choices of one prompt): the prompt is
    /// computed once and every sequence starts from its cache. One receiver per request,
    /// in order.
    pub fn submit_group(&self, requests: Vec<SequenceRequest>) -> Result<Vec<Events>, EngineError> {
        Ok(self.submit_groups(vec![requests])?.remove(0))
    }

    /// Queues several groups (one request's prompts) at once: all of them, or none when
    /// the waiting queue is full ([`EngineError::Overloaded`]). The queue's bound counts
    /// requests, not prompts: a request with many prompts takes one place, and admission
    /// takes the groups of the waiting requests in turn, so it cannot starve the others.
    pub fn submit_groups(
        &self,
        groups: Vec<Vec<SequenceRequest>>,
    ) -> Result<Vec<Vec<Events>>, EngineError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(EngineError::Stopped);
        }
        for requests in &groups {
            let Some(first) = requests.first() else {
                return Err(EngineError::InvalidRequest("no sequences to run".into()));
            };
            if requests.iter().any(|r| r.prompt != first.prompt) {
                return Err(EngineError::InvalidRequest(
                    "the sequences of a group must share their prompt".into(),
                ));
            }
            for request in requests {
                self.check(request)?;
            }
            let need: usize = requests.iter().map(SequenceRequest::kv_need).sum();
            if need > self.config.scheduler.kv_budget {
                return Err(EngineError::InvalidRequest(format!(
                    "the sequences need {need} KV cache positions together; the budget is {}",
                    self.config.scheduler.kv_budget
                )));
            }
        }
        let count = groups.len();
        let max = self.config.max_waiting;
        self.stats
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < max.max(1)).then_some(q + 1)
            })
            .map_err(EngineError::Overloaded)?;
        let slot = Arc::new(QueueSlot {
            stats: Arc::clone(&self.stats),
            request: NEXT_REQUEST.fetch_add(1, Ordering::Relaxed),
        });
        let mut all = Vec::with_capacity(count);
        for requests in groups {
            let mut receivers = Vec::with_capacity(requests.len());
            let mut members = requests.into_iter().map(|r| {
                let (tx, rx) = sequence::channel(self.config.max_unread_events);
                receivers.push(rx);
                (r, tx)
            });
            let (request, events) = members.next().expect("one request at least");
            let pending = Pending {
                request: Box::new(request),
                events,
                followers: members.collect(),
                slot: Arc::clone(&slot),
            };
            if self.commands.send(Command::Submit(pending)).is_err() {
                // The engine thread is gone: the groups never reach its queue, and the
                // slot is given back with them.
                return Err(EngineError::Stopped);
            }
            all.push(receivers);
        }
        Ok(all)
    }

    /// Refuses every later submission ([`EngineError::Stopped`]); what is queued or
    /// running goes on.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Ends everything queued or running now with [`SequenceEvent::Aborted`]; the engine
    /// keeps running.
    pub fn abort_all(&self) {
        let _ = self.commands.send(Command::Abort);
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
        if let Some(bad) = request
            .stop_token_ids
            .iter()
            .chain(request.prediction.iter())
            .chain(request.sampling.logit_bias.iter().map(|(id, _)| id))
            .find(|&&t| t >= vocab)
        {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is out of the vocabulary (0..{vocab})"
            )));
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
            queued: s.queued.load(Ordering::Relaxed),
            kv_reserved: s.kv_reserved.load(Ordering::Relaxed),
            kv_budget: self.config.scheduler.kv_budget,
            steps: s.steps.load(Ordering::Relaxed),
            prompt_tokens: s.prompt_tokens.load(Ordering::Relaxed),
            generated_tokens: s.generated_tokens.load(Ordering::Relaxed),
            finished: s.finished.load(Ordering::Relaxed),
            abandoned: s.abandoned.load(Ordering::Relaxed),
            timed_out: s.timed_out.load(Ordering::Relaxed),
            draft_tokens_accepted: s.draft_tokens_accepted.load(Ordering::Relaxed),
            draft_tokens_fed: s.draft_tokens_fed.load(Ordering::Relaxed),
            prefix_cache_hit_tokens: s.prefix_cache_hit_tokens.load(Ordering::Relaxed),
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
    pub fn start(mut model: Box<dyn Model>, tokenizer: Tokenizer, config: EngineConfig) -> Self {
        model.set_context_length(config.context_length);
        let (tx, rx) = mpsc::channel();
        let tokenizer = Arc::new(tokenizer);
        let stats = Arc::new(EngineStats::default());
        let info = model.info().clone();
        let worker = Worker {
            prefill_token_seconds: 0.0,
            model,
            tokenizer: Arc::clone(&tokenizer),
            config,
            stats: Arc::clone(&stats),
            waiting: VecDeque::new(),
            running: Vec::new(),
            prefix_cache: PrefixCache::new(config.prefix_cache_positions),
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
            constraints: Arc::new(OnceLock::new()),
            closed: Arc::new(AtomicBool::new(false)),
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

    /// Aborts whatever is still queued or running and stops the thread.
    pub fn shutdown(mut self) {
        self.handle.close();
        let _ = self.handle.commands.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long a step that carries a prefill chunk may take while other sequences run:
/// each of them waits that long for its next token. The chunk is sized from
/// the last prefill step's time per prompt token, since that cost grows with the prompt's
/// position (attention).
const PREFILL_STEP_TARGET: Duration = Duration::from_millis(300);

/// How long a prefill step may take while its prompt runs alone: a request that arrives
/// meanwhile waits for the step's end before its own prompt runs (a 512-token step of
/// an 8k prompt took over 2 s, and a one-token request arriving then waited 5 s). Longer
/// than [`PREFILL_STEP_TARGET`]: a lone prompt's chunks stay large where they are cheap.
const PREFILL_ALONE_TARGET: Duration = Duration::from_millis(400);

/// How often the engine looks again when every running sequence waits for its reader.
const BLOCKED_POLL: Duration = Duration::from_millis(5);

/// Smallest prefill chunk while others decode, so that a long prompt still advances.
const MIN_PREFILL_CHUNK: usize = 16;

/// Most sequences decoding together for prompt lookup to draft. A drafted row costs a
/// row's arithmetic; with a few rows a step's time is the weights' reading and a row is
/// almost free, with many the arithmetic is the step's time and a rejected draft slows
/// every sequence in it.
const LOOKUP_MAX_DECODING: usize = 4;

struct Worker {
    /// Seconds per prompt token of the last step that carried a prefill chunk (none
    /// yet: 0), which sizes the next chunk to [`PREFILL_STEP_TARGET`] or
    /// [`PREFILL_ALONE_TARGET`].
    prefill_token_seconds: f64,
    model: Box<dyn Model>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    stats: Arc<EngineStats>,
    waiting: VecDeque<Pending>,
    running: Vec<Sequence>,
    prefix_cache: PrefixCache,
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
            self.drop_late();
            self.drop_stalled();
            self.admit();
            self.step();
            self.publish_counts();
        }
    }

    /// Handles one command; false means stop.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit(pending) => {
                self.waiting.push_back(pending);
                true
            }
            Command::Abort => {
                self.abort_all();
                true
            }
            Command::Shutdown => {
                self.abort_all();
                false
            }
        }
    }

    /// Ends every queued and running sequence with [`SequenceEvent::Aborted`].
    fn abort_all(&mut self) {
        let count = self.running.len() + self.waiting.len();
        if count > 0 {
            tracing::info!(
                sequences = count,
                "aborting what is still queued or running"
            );
        }
        for pending in self.waiting.drain(..) {
            pending.end(SequenceEvent::Aborted);
        }
        for seq in &mut self.running {
            seq.end(SequenceEvent::Aborted);
        }
        self.running.clear();
        self.publish_counts();
    }

    fn drop_abandoned(&mut self) {
        let before = self.running.len() + self.waiting.len();
        self.running.retain(|s| !s.is_abandoned());
        self.waiting.retain(|p| !p.is_abandoned());
        let dropped = before - self.running.len() - self.waiting.len();
        if dropped > 0 {
            self.stats
                .abandoned
                .fetch_add(dropped as u64, Ordering::Relaxed);
            tracing::debug!(dropped, "dropped sequences whose clients went away");
        }
    }

    /// Ends the sequences, running or waiting, whose deadline has passed.
    fn drop_late(&mut self) {
        let now = Instant::now();
        let mut late = 0;
        self.running.retain_mut(|s| {
            let is_late = s.is_late(now);
            if is_late {
                s.end(SequenceEvent::TimedOut);
                late += 1;
            }
            !is_late
        });
        let (keep, gone): (VecDeque<Pending>, VecDeque<Pending>) =
            self.waiting.drain(..).partition(|p| !p.is_late(now));
        self.waiting = keep;
        for pending in gone {
            late += 1;
            pending.end(SequenceEvent::TimedOut);
        }
        if late > 0 {
            self.stats.timed_out.fetch_add(late, Ordering::Relaxed);
        }
    }

    /// Notes which decoding sequences' readers are too far behind to go on, and ends
    /// those that have been so for longer than the stalled-reader timeout.
    fn drop_stalled(&mut self) {
        let now = Instant::now();
        let limit = self.config.stalled_reader_timeout;
        let mut stalled = 0;
        self.running.retain_mut(|s| {
            if !s.is_blocked() {
                s.blocked_since = None;
                return true;
            }
            let since = *s.blocked_since.get_or_insert(now);
            if now - since < limit {
                return true;
            }
            s.end(SequenceEvent::TimedOut);
            stalled += 1;
            false
        });
        if stalled > 0 {
            tracing::info!(stalled, "ended sequences whose readers stopped reading");
            self.stats.timed_out.fetch_add(stalled, Ordering::Relaxed);
        }
    }

    /// Admits waiting groups within the scheduler's limits, taking the waiting requests'
    /// groups in turn (round robin, oldest request first).
    fn admit(&mut self) {
        let reserved: usize = self.running.iter().map(Sequence::reservation).sum();
        let running_requests: HashSet<u64> = self.running.iter().map(|s| s.request).collect();
        let order = self.admission_order();
        let views: Vec<WaitingView> = order.iter().map(|&i| self.waiting[i].view()).collect();
        let chosen = scheduler::admit(
            &self.config.scheduler,
            self.running.len(),
            reserved,
            &running_requests,
            &views,
        );
        if chosen.is_empty() {
            return;
        }
        let n = chosen.len();
        let mut queue: Vec<Option<Pending>> = self.waiting.drain(..).map(Some).collect();
        let admitted: Vec<Pending> = chosen
            .iter()
            .map(|&c| queue[order[c]].take().expect("each group is chosen once"))
            .collect();
        self.waiting = queue.into_iter().flatten().collect();
        let mut slots = Vec::with_capacity(n);
        for pending in admitted {
            let prompt = &pending.request.prompt;
            let capacity =
                (prompt.len() + pending.request.max_tokens).min(self.config.context_length);
            // Prompt logprobs need every prompt row computed.
            let hit = match pending.request.prompt_logprobs {
                Some(_) => None,
                None => {
                    let model = &self.model;
                    self.prefix_cache
                        .lookup(prompt, capacity, |old_len, common| {
                            model.reusable_prefix(old_len, prompt.len(), common)
                        })
                }
            };
            let (cache, cached_tokens) = match hit {
                Some(hit) => {
                    self.stats
                        .prefix_cache_hit_tokens
                        .fetch_add(hit.positions as u64, Ordering::Relaxed);
                    (hit.cache, hit.positions)
                }
                None => (self.model.new_cache(capacity), 0),
            };
            let request = pending.slot.request;
            slots.push(pending.slot);
            let mut seq = Sequence::new(
                *pending.request,
                cache,
                pending.events,
                self.config.prompt_lookup,
            );
            seq.cached_tokens = cached_tokens;
            seq.request = request;
            seq.followers = pending.followers;
            self.running.push(seq);
        }
        // Counted as running before their requests leave the queue's count (with the
        // slots), so that running plus queued is never seen as zero while they run.
        self.publish_counts();
        drop(slots);
    }

    /// Indices into the waiting queue in admission order: the first group of every
    /// waiting request (oldest first), then the second of each, and so on.
    fn admission_order(&self) -> Vec<usize> {
        let mut requests: Vec<Vec<usize>> = Vec::new();
        let mut index: HashMap<*const QueueSlot, usize> = HashMap::new();
        for (i, pending) in self.waiting.iter().enumerate() {
            let r = *index.entry(Arc::as_ptr(&pending.slot)).or_insert_with(|| {
                requests.push(Vec::new());
                requests.len() - 1
            });
            requests[r].push(i);
        }
        let mut order = Vec::with_capacity(self.waiting.len());
        let mut round = 0;
        while order.len() < self.waiting.len() {
            order.extend(requests.iter().filter_map(|groups| groups.get(round)));
            round += 1;
        }
        order
    }

    fn step(&mut self) {
        if self.running.is_empty() {
            return;
        }
        let vocab = self.tokenizer.vocab_size();
        let views: Vec<RunningView> = self
            .running
            .iter()
            .map(|s| RunningView {
                pending_prefill: s.pending_prefill(),
                passed_over: s.passed_over,
                blocked: s.blocked_since.is_some(),
                max_chunk: s.max_prefill_chunk(vocab, self.config.scored_logits_bytes),
            })
            .collect();
        if views.iter().all(|v| v.blocked) {
            // Nothing can go on until a reader catches up: wait for one, or for a new
            // command, rather than spin.
            std::thread::sleep(BLOCKED_POLL);
            return;
        }
        let decoding = scheduler::decoding(&views);
        // With others running, a prompt's chunk must not make them wait long for their
        // next token (or their own first one); alone, not long for one that may arrive.
        let shared = self.running.len() > 1;
        let mut config = self.config.scheduler;
        let chunk = self.prefill_chunk(match shared {
            true => PREFILL_STEP_TARGET,
            false => PREFILL_ALONE_TARGET,
        });
        config.max_step_tokens = config.max_step_tokens.min(decoding + chunk);
        let plan = scheduler::plan_step(&config, &views);
        for ((seq, view), &n) in self.running.iter_mut().zip(&views).zip(&plan) {
            seq.passed_over = match view.pending_prefill > 0 && n == 0 {
                true => seq.passed_over + 1,
                false => 0,
            };
        }
        // Drafted rows cost arithmetic: worth it while a step's time is the weights'
        // reading, that is while few sequences decode.
        if decoding <= LOOKUP_MAX_DECODING {
            for (seq, &n) in self.running.iter_mut().zip(&plan) {
                if n > 0 {
                    seq.draft_by_lookup();
                }
            }
        }
        let prefill_tokens: usize = views
            .iter()
            .zip(&plan)
            .filter(|(v, _)| v.pending_prefill > 0)
            .map(|(_, n)| n)
            .sum();
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| self.forward_and_sample(&plan)));
        if prefill_tokens > 0 {
            // Measured alone or shared, so that the first step shared with a newcomer is
            // sized for it already.
            self.prefill_token_seconds = started.elapsed().as_secs_f64() / prefill_tokens as f64;
        }
        match outcome {
            Ok(Ok(finished)) => {
                let running = std::mem::take(&mut self.running);
                for (seq, done) in running.into_iter().zip(finished) {
                    if done {
                        self.stats.finished.fetch_add(1, Ordering::Relaxed);
                        // Its keys and values may start a later sequence.
                        self.prefix_cache
                            .insert(&seq.tokens, seq.prompt_len, seq.cache);
                    } else {
                        self.running.push(seq);
                    }
                }
            }
            Ok(Err(e)) => self.fail_all(&format!("inference failed: {e}")),
            Err(_) => self.fail_all("inference failed: internal error"),
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        self.stats
            .prompt_tokens
            .fetch_add(prefill_tokens as u64, Ordering::Relaxed);
    }

    /// Most prompt tokens a step may carry to take about `target`, from the last
    /// prefill step's time per token (the whole step budget before any was measured).
    fn prefill_chunk(&self, target: Duration) -> usize {
        let max = self.config.scheduler.max_step_tokens;
        if self.prefill_token_seconds <= 0.0 {
            return max;
        }
        ((target.as_secs_f64() / self.prefill_token_seconds) as usize).clamp(MIN_PREFILL_CHUNK, max)
    }

    /// Runs one forward step with `plan[i]` tokens of running sequence i (plus any draft
    /// tokens), hands each sequence its logits rows, and returns which sequences finished.
    /// Followers started this step join the running set.
    fn forward_and_sample(&mut self, plan: &[usize]) -> Result<Vec<bool>, EngineError> {
        let inputs: Vec<Option<(Vec<u32>, Logits)>> = self
            .running
            .iter()
            .zip(plan)
            .map(|(seq, &n)| (n > 0).then(|| seq.step_input(n)))
            .collect();
        let mut entries = Vec::new();
        for (seq, input) in self.running.iter_mut().zip(&inputs) {
            if let Some((tokens, logits)) = input {
                entries.push(BatchEntry {
                    tokens,
                    cache: &mut seq.cache,
                    logits: *logits,
                    prompt_len: seq.prompt_len,
                });
            }
        }
        // The whole step runs on the compute pool, its other threads kept awake: its
        // parallel regions then split work among threads already running, rather than
        // waking them (and parking this thread) once per matrix product.
        let model = &self.model;
        let mut rows =
            crate::threads::with_threads_awake(|| model.forward(&mut entries))?.into_iter();
        drop(entries);
        // Each sequence's rows, then every sequence's sampling: on the compute pool, the
        // sequences side by side (a token of a 262,144-word vocabulary drawn with top-p
        // takes about a millisecond and a half; one sequence after another, the pool's
        // other threads waited through all of them).
        let mut jobs = Vec::new();
        for ((i, seq), input) in self.running.iter_mut().enumerate().zip(&inputs) {
            let Some((tokens, logits)) = input else {
                continue;
            };
            let count = match logits {
                Logits::None => 0,
                Logits::Last => 1,
                Logits::All => tokens.len(),
            };
            let seq_rows: Vec<Vec<f32>> = rows.by_ref().take(count).collect();
            jobs.push((i, seq, tokens.as_slice(), seq_rows));
        }
        let (tokenizer, stats) = (&self.tokenizer, &self.stats);
        let context = self.config.context_length;
        let settle_one =
            |(i, seq, tokens, seq_rows): (usize, &mut Sequence, &[u32], Vec<Vec<f32>>)| {
                (i, settle(seq, tokens, &seq_rows, tokenizer, stats, context))
            };
        let settled: Vec<(usize, Settled)> = match jobs.len() {
            0 | 1 => jobs.into_iter().map(settle_one).collect(),
            _ => crate::threads::with_threads_awake(|| {
                jobs.into_par_iter().map(settle_one).collect()
            }),
        };
        let mut finished = vec![false; self.running.len()];
        let mut started = Vec::new();
        for (i, outcome) in settled {
            finished[i] = outcome.finished;
            started.extend(outcome.started);
        }
        self.running.extend(started);
        finished.resize(self.running.len(), false);
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
        let reserved: usize = self.running.iter().map(Sequence::reservation).sum();
        self.stats.kv_reserved.store(reserved, Ordering::Relaxed);
    }
}

/// What sampling a step's rows did to one sequence.
struct Settled {
    /// Whether the sequence is finished.
    finished: bool,
    /// Followers started from its prompt's last row (`n` and `best_of`).
    started: Vec<Sequence>,
}

/// Hands `seq` its rows of the step that fed it `tokens`: the end of its prompt (its
/// followers forked from the last row) or its next tokens (drafts verified), counted in
/// `stats`.
fn settle(
    seq: &mut Sequence,
    tokens: &[u32],
    seq_rows: &[Vec<f32>],
    tokenizer: &Tokenizer,
    stats: &EngineStats,
    context: usize,
) -> Settled {
    let mut started = Vec::new();
    let generated_before = seq.completion_tokens();
    let was_prefill = seq.tokens.len() == seq.prompt_len;
    let finished = if was_prefill {
        if !seq.accept_prefill(seq_rows, tokens.len()) {
            return Settled {
                finished: false,
                started,
            };
        }
        let last = seq_rows.last().expect("the prompt's last logits");
        let scores = seq.prompt_scores();
        for (request, events) in std::mem::take(&mut seq.followers) {
            if events.is_closed() {
                continue;
            }
            let (follower, done) =
                seq.fork(request, events, last, scores.as_deref(), tokenizer, context);
            stats
                .generated_tokens
                .fetch_add(follower.completion_tokens() as u64, Ordering::Relaxed);
            if done {
                stats.finished.fetch_add(1, Ordering::Relaxed);
            } else {
                started.push(follower);
            }
        }
        seq.complete_prompt(last, tokenizer, context)
    } else {
        let finished = seq.verify(seq_rows, tokens, tokenizer, context);
        let accepted = seq.completion_tokens() - generated_before;
        stats
            .draft_tokens_accepted
            .fetch_add(accepted.saturating_sub(1) as u64, Ordering::Relaxed);
        stats
            .draft_tokens_fed
            .fetch_add(tokens.len() as u64 - 1, Ordering::Relaxed);
        finished
    };
    let generated = seq.completion_tokens() - generated_before;
    stats
        .generated_tokens
        .fetch_add(generated as u64, Ordering::Relaxed);
    Settled { finished, started }
}
