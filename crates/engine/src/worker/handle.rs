//! The engine's API: a cheap, cloneable [`EngineHandle`] that checks a request once (the
//! prompt, its token ids against the vocabulary, the context and the KV budget) and
//! queues it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock};

use super::queue::{Pending, QueueSlot};
use super::stats::EngineStats;
pub use super::stats::StatsSnapshot;
use super::EngineConfig;
use crate::constrain::{Constraint, ConstraintFactory, Grammar};
use crate::error::EngineError;
use crate::kv_cache::KvTypes;
use crate::model::ModelInfo;
use crate::sequence::{self, Events, SequenceRequest};
use crate::tokenizer::Tokenizer;
use crate::vision::prompt::PromptImage;
use crate::vision::VisionModel;

/// What the handle sends the engine thread.
pub(super) enum Command {
    Submit(Pending),
    /// End everything queued or running with [`SequenceEvent::Aborted`](crate::sequence::SequenceEvent::Aborted); keep running.
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
    kv_types: KvTypes,
    constraints: Arc<OnceLock<Result<ConstraintFactory, String>>>,
    closed: Arc<AtomicBool>,
    vision: Option<Arc<VisionModel>>,
}

impl EngineHandle {
    /// A handle that sends `commands` to the engine thread.
    pub(super) fn new(
        commands: Sender<Command>,
        tokenizer: Arc<Tokenizer>,
        info: ModelInfo,
        config: EngineConfig,
        stats: Arc<EngineStats>,
        vision: Option<Arc<VisionModel>>,
        kv_types: KvTypes,
    ) -> Self {
        Self {
            commands,
            tokenizer,
            info,
            config,
            stats,
            kv_types,
            constraints: Arc::new(OnceLock::new()),
            closed: Arc::new(AtomicBool::new(false)),
            vision,
        }
    }

    /// The vision model that reads the prompts' images, if the engine has one.
    pub fn vision(&self) -> Option<&Arc<VisionModel>> {
        self.vision.as_ref()
    }

    /// Sends the engine thread a command (it may be gone: nothing to tell then).
    pub(super) fn send(&self, command: Command) {
        let _ = self.commands.send(command);
    }

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
        let mut checked_allowed: Vec<Arc<[u32]>> = Vec::new();
        for requests in &groups {
            let Some(first) = requests.first() else {
                return Err(EngineError::invalid("n", "no sequences to run"));
            };
            if requests.iter().any(|r| r.prompt != first.prompt) {
                return Err(EngineError::invalid(
                    "prompt",
                    "the sequences of a group must share their prompt",
                ));
            }
            for request in requests {
                self.check_except_allowed(request)?;
                // A request's choices share one list: checked once, not once per choice.
                if let Some(allowed) = &request.allowed_tokens {
                    if !checked_allowed.iter().any(|c| Arc::ptr_eq(c, allowed)) {
                        self.in_vocabulary("allowed_token_ids", allowed.iter())?;
                        checked_allowed.push(Arc::clone(allowed));
                    }
                }
            }
            let need: usize = requests.iter().map(SequenceRequest::kv_need).sum();
            if need > self.config.scheduler.kv_budget {
                return Err(EngineError::invalid(
                    "max_tokens",
                    format!(
                        "the sequences need {need} KV cache positions together; the budget is {}",
                        self.config.scheduler.kv_budget
                    ),
                ));
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
        let slot = QueueSlot::new(Arc::clone(&self.stats));
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

    /// Ends everything queued or running now with [`SequenceEvent::Aborted`](crate::sequence::SequenceEvent::Aborted); the engine
    /// keeps running.
    pub fn abort_all(&self) {
        self.send(Command::Abort);
    }

    /// The engine's one check of a request, which [`Self::submit_groups`] makes and a
    /// caller may make earlier (before it decodes the prompt's ids, say): the prompt is not
    /// empty, shorter than the context, and its ids, `stop_token_ids`, `prediction`'s,
    /// `logit_bias`'s and `allowed_token_ids` are in the vocabulary. The error names the
    /// field.
    pub fn check(&self, request: &SequenceRequest) -> Result<(), EngineError> {
        self.check_except_allowed(request)?;
        match &request.allowed_tokens {
            Some(allowed) => self.in_vocabulary("allowed_token_ids", allowed.iter()),
            None => Ok(()),
        }
    }

    /// [`Self::check`] but for `allowed_token_ids` (a list of up to the vocabulary's size
    /// that the choices of a request share).
    fn check_except_allowed(&self, request: &SequenceRequest) -> Result<(), EngineError> {
        self.check_prompt_with_images(&request.prompt, &request.images)?;
        self.in_vocabulary("stop_token_ids", request.stop_token_ids.iter())?;
        self.in_vocabulary("prediction", request.prediction.iter())?;
        self.in_vocabulary(
            "logit_bias",
            request.sampling.logit_bias.iter().map(|(id, _)| id),
        )
    }

    /// [`Self::check`]'s rules for a prompt alone: not empty, shorter than the context, its
    /// ids in the vocabulary (for the other prompts of a request whose first was checked).
    pub fn check_prompt(&self, prompt: &[u32]) -> Result<(), EngineError> {
        self.check_prompt_with_images(prompt, &[])
    }

    /// [`Self::check_prompt`] for a prompt with images: each image's run of placeholders
    /// is where it says, in prompt order, and every other id is in the vocabulary.
    pub fn check_prompt_with_images(
        &self,
        prompt: &[u32],
        images: &[PromptImage],
    ) -> Result<(), EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::invalid("prompt", "the prompt is empty"));
        }
        if !images.is_empty() && self.vision.is_none() {
            return Err(EngineError::invalid(
                "images",
                "this model reads text only (a vision model is served with `--mmproj`)",
            ));
        }
        let mut text_from = 0;
        for (k, image) in images.iter().enumerate() {
            let span = image.span();
            let placed = span.start >= text_from
                && span.end <= prompt.len()
                && prompt[span.clone()]
                    .iter()
                    .copied()
                    .eq(image.placeholders());
            if !placed {
                return Err(EngineError::invalid(
                    "images",
                    format!("image {k} is not where the prompt holds its positions"),
                ));
            }
            let fits = self
                .vision
                .as_ref()
                .and_then(|v| v.view_tokens(&image.image));
            if fits != Some(image.tokens) {
                return Err(EngineError::invalid(
                    "images",
                    format!("image view {k} is not one this model's vision tower reads"),
                ));
            }
            self.in_vocabulary("prompt", prompt[text_from..span.start].iter())?;
            text_from = span.end;
        }
        self.in_vocabulary("prompt", prompt[text_from..].iter())?;
        if prompt.len() >= self.config.context_length {
            return Err(EngineError::invalid(
                "prompt",
                format!(
                    "the prompt has {} tokens; this model's context is {}",
                    prompt.len(),
                    self.config.context_length
                ),
            ));
        }
        Ok(())
    }

    /// An error naming `field` for the first of `ids` past the vocabulary.
    fn in_vocabulary<'a>(
        &self,
        field: &'static str,
        mut ids: impl Iterator<Item = &'a u32>,
    ) -> Result<(), EngineError> {
        let vocab = self.info.vocab_size as u32;
        match ids.find(|&&t| t >= vocab) {
            Some(bad) => Err(EngineError::invalid(
                field,
                format!("token id {bad} is out of the vocabulary (0..{vocab})"),
            )),
            None => Ok(()),
        }
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

    /// KV cache positions the running sequences may reserve together.
    pub fn kv_budget(&self) -> usize {
        self.config.scheduler.kv_budget
    }

    /// The types the KV cache stores keys and values in.
    pub fn kv_types(&self) -> KvTypes {
        self.kv_types
    }

    /// Bytes one KV cache position takes (every layer's keys and values).
    pub fn kv_position_bytes(&self) -> usize {
        self.kv_types
            .position_bytes(self.info.n_layers, self.info.kv_width)
    }

    /// The engine's counters now.
    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.stats;
        StatsSnapshot {
            running: s.running.load(Ordering::Acquire),
            queued: s.queued.load(Ordering::Relaxed),
            kv_reserved: s.kv_reserved.load(Ordering::Relaxed),
            kv_budget: self.config.scheduler.kv_budget,
            kv_position_bytes: self.kv_position_bytes(),
            steps: s.steps.load(Ordering::Relaxed),
            prompt_tokens: s.prompt_tokens.load(Ordering::Relaxed),
            generated_tokens: s.generated_tokens.load(Ordering::Relaxed),
            finished: s.finished.load(Ordering::Relaxed),
            abandoned: s.abandoned.load(Ordering::Relaxed),
            timed_out: s.timed_out.load(Ordering::Relaxed),
            draft_tokens_accepted: s.draft_tokens_accepted.load(Ordering::Relaxed),
            draft_tokens_fed: s.draft_tokens_fed.load(Ordering::Relaxed),
            prefix_cache_hit_tokens: s.prefix_cache_hit_tokens.load(Ordering::Relaxed),
            images_encoded: s.images_encoded.load(Ordering::Relaxed),
        }
    }
}
