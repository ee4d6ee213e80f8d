//! One sequence's life in the engine: its tokens, cache, sampler, text and stop state,
//! and the events it sends back.

use tokio::sync::mpsc::UnboundedSender;

use crate::kv_cache::SequenceCache;
use crate::sampling::{log_sum_exp, Sampler, SamplingParams};
use crate::stop::{StopCheck, StopMatcher};
use crate::tokenizer::{IncrementalDecoder, TokenId, Tokenizer};

/// Everything needed to generate one completion choice.
#[derive(Debug, Clone)]
pub struct SequenceRequest {
    /// Prompt tokens (BOS included when the model wants one).
    pub prompt: Vec<TokenId>,
    /// How tokens are picked.
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Strings that end generation when they appear in the output.
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens.
    pub ignore_eos: bool,
}

/// Why a sequence ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token.
    EndOfSequence(TokenId),
    /// A stop string matched.
    StopString(String),
    /// `max_tokens` reached, or the context is full.
    Length,
}

/// What the engine sends back for a sequence, in order: tokens, then one `Finished`
/// (or one `Failed`).
#[derive(Debug, Clone, PartialEq)]
pub enum SequenceEvent {
    /// A generated token with its log-probability and the text it released (possibly
    /// empty: held back as a partial character or a possible stop string).
    Token {
        /// The token.
        id: TokenId,
        /// Its log-probability under the model (before sampling filters).
        logprob: f32,
        /// Text now safe to send.
        text: String,
    },
    /// Generation ended.
    Finished {
        /// Why.
        reason: FinishReason,
        /// Prompt length in tokens.
        prompt_tokens: usize,
        /// Tokens generated.
        completion_tokens: usize,
    },
    /// The engine failed this sequence.
    Failed(String),
}

/// A sequence inside the engine.
pub(crate) struct Sequence {
    pub(crate) tokens: Vec<TokenId>,
    pub(crate) prompt_len: usize,
    pub(crate) cache: SequenceCache,
    pub(crate) max_tokens: usize,
    sampler: Sampler,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    ignore_eos: bool,
    events: UnboundedSender<SequenceEvent>,
}

impl Sequence {
    pub(crate) fn new(
        request: SequenceRequest,
        cache: SequenceCache,
        events: UnboundedSender<SequenceEvent>,
    ) -> Self {
        let prompt_len = request.prompt.len();
        Self {
            tokens: request.prompt,
            prompt_len,
            cache,
            max_tokens: request.max_tokens,
            sampler: Sampler::new(request.sampling),
            decoder: IncrementalDecoder::new(),
            stop: StopMatcher::new(request.stop, false),
            ignore_eos: request.ignore_eos,
            events,
        }
    }

    /// KV positions this sequence may need in all.
    pub(crate) fn reservation(&self) -> usize {
        self.prompt_len + self.max_tokens
    }

    /// Prompt tokens not yet in the cache.
    pub(crate) fn pending_prefill(&self) -> usize {
        self.prompt_len.saturating_sub(self.cache.len())
    }

    /// Whether the receiver is gone (the client disconnected).
    pub(crate) fn is_abandoned(&self) -> bool {
        self.events.is_closed()
    }

    pub(crate) fn completion_tokens(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Samples the next token from `logits`, emits its event, and says whether the
    /// sequence is finished. `context` is the model's context length.
    pub(crate) fn accept_logits(
        &mut self,
        logits: &[f32],
        tokenizer: &Tokenizer,
        context: usize,
    ) -> bool {
        let id = self.sampler.sample(logits);
        let logprob = logits[id as usize] - log_sum_exp(logits);
        self.tokens.push(id);
        let (mut text, mut finish) = if tokenizer.is_end_of_generation(id) && !self.ignore_eos {
            (self.release_all(), Some(FinishReason::EndOfSequence(id)))
        } else {
            let delta = self.decoder.push(&tokenizer.token_bytes(id, false));
            match self.stop.push(&delta) {
                StopCheck::Continue { release } => (release, None),
                StopCheck::Stopped { release, matched } => {
                    (release, Some(FinishReason::StopString(matched)))
                }
            }
        };
        let out_of_room =
            self.completion_tokens() >= self.max_tokens || self.tokens.len() >= context;
        if finish.is_none() && out_of_room {
            text.push_str(&self.release_all());
            finish = Some(FinishReason::Length);
        }
        self.send(SequenceEvent::Token { id, logprob, text });
        match finish {
            Some(reason) => {
                self.finish(reason);
                true
            }
            None => false,
        }
    }

    /// Releases everything held back: incomplete bytes and possible stop-string starts.
    fn release_all(&mut self) -> String {
        let tail = self.decoder.finish();
        let mut text = match self.stop.push(&tail) {
            StopCheck::Continue { release } | StopCheck::Stopped { release, .. } => release,
        };
        text.push_str(&self.stop.flush());
        text
    }

    /// Sends the final event.
    pub(crate) fn finish(&mut self, reason: FinishReason) {
        let event = SequenceEvent::Finished {
            reason,
            prompt_tokens: self.prompt_len,
            completion_tokens: self.completion_tokens(),
        };
        self.send(event);
    }

    pub(crate) fn fail(&mut self, message: String) {
        self.send(SequenceEvent::Failed(message));
    }

    fn send(&self, event: SequenceEvent) {
        // A closed receiver is noticed by `is_abandoned` on the next step.
        let _ = self.events.send(event);
    }
}
