//! The engine thread's loop: it takes commands, drops what was abandoned, is late or has
//! a stalled reader, admits waiting groups within the scheduler's limits (prefix cache
//! first), runs one batched forward step and hands each sequence its rows.

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use super::handle::Command;
use super::images::{ImageEncoder, DEFAULT_EMBEDDING_CACHE_BYTES};
use super::queue::WaitQueue;
use super::stats::EngineStats;
use super::EngineConfig;
use crate::error::EngineError;
use crate::model::{BatchEntry, ImageGrid, Logits, Model, StepImage};
use crate::prefix_cache::PrefixCache;
use crate::running::Sequence;
use crate::scheduler::{self, RunningView};
use crate::sequence::SequenceEvent;
use crate::tokenizer::Tokenizer;
use crate::vision::prompt::whole_images_prefix;
use crate::vision::VisionModel;

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

/// The engine thread's state.
pub(super) struct Worker {
    /// Seconds per prompt token of the last step that carried a prefill chunk (none
    /// yet: 0), which sizes the next chunk to [`PREFILL_STEP_TARGET`] or
    /// [`PREFILL_ALONE_TARGET`].
    prefill_token_seconds: f64,
    model: Box<dyn Model>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    stats: Arc<EngineStats>,
    waiting: WaitQueue,
    running: Vec<Sequence>,
    prefix_cache: PrefixCache,
    images: ImageEncoder,
}

impl Worker {
    /// The state of a new engine thread for `model`.
    pub fn new(
        model: Box<dyn Model>,
        vision: Option<Arc<VisionModel>>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
        stats: Arc<EngineStats>,
    ) -> Self {
        let grid_positions = model.info().grid_positions;
        Self {
            prefill_token_seconds: 0.0,
            model,
            tokenizer,
            config,
            stats,
            waiting: WaitQueue::default(),
            running: Vec::new(),
            prefix_cache: PrefixCache::new(config.prefix_cache_positions),
            images: ImageEncoder::new(vision, DEFAULT_EMBEDDING_CACHE_BYTES, grid_positions),
        }
    }

    /// Runs until told to stop, or until the handles are gone and nothing is left to run.
    pub fn run(mut self, commands: Receiver<Command>) {
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
                self.waiting.push(pending);
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
        self.waiting.end_all(SequenceEvent::Aborted);
        for seq in &mut self.running {
            seq.end(SequenceEvent::Aborted);
        }
        self.running.clear();
        self.publish_counts();
    }

    /// Drops the sequences, running or waiting, whose clients went away.
    fn drop_abandoned(&mut self) {
        let before = self.running.len();
        self.running.retain(|s| !s.is_abandoned());
        let dropped = before - self.running.len() + self.waiting.drop_abandoned();
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
        late += self.waiting.end_late(now);
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
        let order = self.waiting.admission_order();
        let views = self.waiting.views(&order);
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
        let admitted = self.waiting.take(chosen.iter().map(|&c| order[c]));
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
                            let common = whole_images_prefix(prompt, common);
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
            if let Err(e) = self.images.admit(&mut seq) {
                seq.fail(e.to_string());
                continue;
            }
            self.running.push(seq);
        }
        // Counted as running before their requests leave the queue's count (with the
        // slots), so that running plus queued is never seen as zero while they run.
        self.publish_counts();
        drop(slots);
    }

    /// Runs one forward step over the running sequences, as the scheduler plans it.
    fn step(&mut self) {
        if self.running.is_empty() {
            return;
        }
        let encoding = ImageEncoder::pending(&self.running);
        if encoding {
            self.encode_images();
        }
        let vocab = self.tokenizer.vocab_size();
        let views: Vec<RunningView> = self
            .running
            .iter()
            .map(|s| RunningView {
                pending_prefill: s.ready_prefill(),
                passed_over: s.passed_over,
                // A prompt that waits for its image's encoding waits as a stalled reader
                // does: no tokens this step.
                blocked: s.blocked_since.is_some()
                    || (s.pending_prefill() > 0 && s.ready_prefill() == 0),
                max_chunk: s.max_prefill_chunk(vocab, self.config.scored_logits_bytes),
            })
            .collect();
        if views.iter().all(|v| v.blocked) {
            if encoding {
                // The images' encoding goes on at the next step.
                return;
            }
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

    /// A step's share of the running sequences' image encoding: as long as a prompt chunk
    /// may take with others running (or alone); a sequence whose image fails ends with
    /// the error.
    fn encode_images(&mut self) {
        let target = match self.running.len() > 1 {
            true => PREFILL_STEP_TARGET,
            false => PREFILL_ALONE_TARGET,
        };
        let deadline = Instant::now() + target;
        let failed = self
            .images
            .advance(&mut self.running, deadline, &self.stats);
        for (i, e) in failed.into_iter().rev() {
            let mut seq = self.running.remove(i);
            seq.fail(format!("the image could not be encoded: {e}"));
        }
        self.publish_counts();
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
                let images = seq
                    .image_slices(seq.cache.len(), tokens.len())
                    .into_iter()
                    .filter_map(|slice| {
                        let image = &seq.images[slice.image];
                        let rows = image.rows.as_deref()?;
                        let width = rows.len() / image.image.tokens;
                        Some(StepImage {
                            at: slice.at,
                            rows: &rows[slice.rows.start * width..slice.rows.end * width],
                            bidirectional: image.bidirectional.then(|| image.image.span()),
                        })
                    })
                    .collect();
                let grids = seq
                    .images
                    .iter()
                    .filter_map(|image| {
                        Some(ImageGrid {
                            span: image.image.span(),
                            columns: image.grid_columns?,
                        })
                    })
                    .collect();
                entries.push(BatchEntry {
                    tokens,
                    cache: &mut seq.cache,
                    logits: *logits,
                    prompt_len: seq.prompt_len,
                    images,
                    grids,
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

    /// Ends every running sequence with an error.
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

    /// Stores the running count and the KV reserved in the counters. The running count is
    /// released: a reader that sees it also sees the step counters added before it.
    fn publish_counts(&self) {
        self.stats
            .running
            .store(self.running.len(), Ordering::Release);
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
