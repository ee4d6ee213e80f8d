//! What a caller asks the engine to generate and what it gets back: one
//! [`SequenceRequest`] per choice in, a stream of [`SequenceEvent`]s out ([`Events`]).
//!
//! The stream counts the events not yet read. The engine stops generating for a sequence
//! whose reader has fallen the engine's `max_unread_events` behind
//! ([`DEFAULT_MAX_UNREAD_EVENTS`] unless set; a streaming client that stopped reading:
//! its server stops taking events once its own buffers are full), so that what a client
//! does not read is bounded, not queued for ever; it goes on once the reader catches up.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::constrain::Constraint;
use crate::sampling::SamplingParams;
use crate::stop::StopStrings;
use crate::tokenizer::TokenId;
use crate::vision::prompt::PromptImage;

/// Everything needed to generate one completion choice.
#[derive(Debug, Clone)]
pub struct SequenceRequest {
    /// Prompt tokens (BOS included when the model wants one).
    pub prompt: Vec<TokenId>,
    /// How tokens are picked.
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Strings that end generation when they appear in the output (shared by the
    /// choices of a request).
    pub stop: StopStrings,
    /// Keep a matched stop string in the output text.
    pub include_stop_str_in_output: bool,
    /// Tokens that end generation besides the model's end-of-generation tokens.
    pub stop_token_ids: Vec<TokenId>,
    /// Keep generating past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Before this many tokens, end-of-generation and stop tokens cannot be sampled and
    /// stop strings do not match.
    pub min_tokens: usize,
    /// With `Some(n)`, every token event carries the `n` most likely alternatives.
    pub top_logprobs: Option<usize>,
    /// Whether token events carry the sampled token's log-probability even without
    /// `top_logprobs` (to rank choices, say). It costs a pass over the vocabulary per token.
    pub token_logprobs: bool,
    /// Leave special (control) tokens out of the text.
    pub skip_special_tokens: bool,
    /// With `Some(n)`, the prompt's tokens get log-probabilities (and `n` alternatives)
    /// too, in one [`SequenceEvent::PromptLogprobs`] before the first token.
    pub prompt_logprobs: Option<usize>,
    /// With `Some`, only these tokens may be sampled (vLLM's `allowed_token_ids`): every
    /// other logit is masked, after the grammar's mask. Where the grammar allows none of
    /// them, the grammar wins.
    pub allowed_tokens: Option<Arc<[TokenId]>>,
    /// Expected output tokens, verified as drafts: several tokens per forward step while
    /// they match, with the same output as without them.
    pub prediction: Vec<TokenId>,
    /// When to give up ([`SequenceEvent::TimedOut`]).
    pub deadline: Option<Instant>,
    /// A grammar the output must follow, compiled for this sequence.
    pub constraint: Option<Constraint>,
    /// The prompt's images: each takes a run of placeholder tokens in `prompt`
    /// ([`crate::vision::prompt`]), in prompt order. Only for an engine with a vision
    /// model.
    pub images: Vec<PromptImage>,
}

impl SequenceRequest {
    /// A request with every option at its default: sample `prompt` for up to
    /// `max_tokens` tokens.
    pub fn new(prompt: Vec<TokenId>, sampling: SamplingParams, max_tokens: usize) -> Self {
        Self {
            prompt,
            sampling,
            max_tokens,
            stop: StopStrings::default(),
            include_stop_str_in_output: false,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            min_tokens: 0,
            top_logprobs: None,
            token_logprobs: true,
            skip_special_tokens: true,
            prompt_logprobs: None,
            allowed_tokens: None,
            prediction: Vec::new(),
            deadline: None,
            constraint: None,
            images: Vec::new(),
        }
    }

    /// KV cache positions this sequence may need: its prompt plus `max_tokens`.
    pub fn kv_need(&self) -> usize {
        self.prompt.len() + self.max_tokens
    }
}

/// Why a sequence ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token.
    EndOfSequence(TokenId),
    /// One of the request's `stop_token_ids`.
    StopToken(TokenId),
    /// The grammar is complete, or allows no token at all from here.
    GrammarComplete,
    /// The grammar's next mask would cost more than its limits allow; the text is
    /// incomplete. Carries llguidance's reason.
    GrammarLimit(String),
    /// A stop string matched.
    StopString(String),
    /// `max_tokens` reached, or the context is full.
    Length,
}

/// A prompt token's log-probability given the tokens before it.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    /// The token.
    pub id: TokenId,
    /// Its log-probability; `None` for the first token, which nothing predicts.
    pub logprob: Option<f32>,
    /// Its rank at its position, 1 for the most likely token (one more than the number of
    /// tokens with a higher logit); `None` for the first token.
    pub rank: Option<u32>,
    /// The most likely tokens at its position, best first.
    pub top: Vec<(TokenId, f32)>,
}

/// What the engine sends back for a sequence, in order: the prompt's logprobs if asked
/// for, tokens, then one `Finished` (or one `Failed`, `TimedOut` or `Aborted`).
#[derive(Debug, Clone, PartialEq)]
pub enum SequenceEvent {
    /// A generated token with its log-probability and the text it released (possibly
    /// empty: held back as a partial character or a possible stop string).
    Token {
        /// The token.
        id: TokenId,
        /// Its log-probability under the model (before sampling filters), when
        /// `top_logprobs` or `token_logprobs` asked for it.
        logprob: Option<f32>,
        /// Text now safe to send.
        text: String,
        /// Characters this token decoded to (special tokens per `skip_special_tokens`),
        /// whether released now or held back; a character split across tokens counts for
        /// the token that completes it.
        decoded_chars: usize,
        /// The most likely tokens at this step with their log-probabilities, best first
        /// (empty unless asked for).
        top: Vec<(TokenId, f32)>,
    },
    /// Generation ended.
    Finished {
        /// Why.
        reason: FinishReason,
        /// Prompt length in tokens.
        prompt_tokens: usize,
        /// Tokens generated.
        completion_tokens: usize,
        /// Prompt tokens whose keys and values came from the prefix cache (not computed
        /// again).
        cached_tokens: usize,
    },
    /// Log-probabilities of the prompt tokens.
    PromptLogprobs(Vec<PromptLogprob>),
    /// The engine failed this sequence.
    Failed(String),
    /// The deadline passed before the sequence finished.
    TimedOut,
    /// The engine stopped (the server is shutting down) before the sequence finished.
    Aborted,
}

/// Events a reader may leave unread before its sequence stops generating, unless the
/// engine is configured otherwise ([`crate::EngineConfig::max_unread_events`]): a token
/// each, with its alternatives when asked for, so some tens of KiB at most.
pub const DEFAULT_MAX_UNREAD_EVENTS: usize = 64;

/// A new channel for one sequence's events, whose sender counts as full once its reader
/// is `max_unread` events behind (at least one).
pub(crate) fn channel(max_unread: usize) -> (EventSender, Events) {
    let (tx, rx) = unbounded_channel();
    let unread = Arc::new(AtomicUsize::new(0));
    (
        EventSender {
            tx,
            unread: Arc::clone(&unread),
            max_unread: max_unread.max(1),
        },
        Events { rx, unread },
    )
}

/// The engine's end of a sequence's events.
pub(crate) struct EventSender {
    tx: UnboundedSender<SequenceEvent>,
    unread: Arc<AtomicUsize>,
    max_unread: usize,
}

impl EventSender {
    /// Sends `event`; a reader that went away is noticed by [`EventSender::is_closed`].
    pub(crate) fn send(&self, event: SequenceEvent) {
        if self.tx.send(event).is_ok() {
            self.unread.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Whether the reader went away.
    pub(crate) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Whether the reader is as far behind as the channel allows, or further.
    pub(crate) fn is_full(&self) -> bool {
        self.unread.load(Ordering::Acquire) >= self.max_unread
    }
}

/// A sequence's events, as the engine sends them. Dropping it cancels the sequence at the
/// engine's next step.
pub struct Events {
    rx: UnboundedReceiver<SequenceEvent>,
    unread: Arc<AtomicUsize>,
}

impl Events {
    /// The next event; `None` once the engine has dropped the sequence.
    pub async fn recv(&mut self) -> Option<SequenceEvent> {
        let event = self.rx.recv().await?;
        self.unread.fetch_sub(1, Ordering::AcqRel);
        Some(event)
    }

    /// [`Events::recv`] for a thread outside an async runtime.
    pub fn blocking_recv(&mut self) -> Option<SequenceEvent> {
        let event = self.rx.blocking_recv()?;
        self.unread.fetch_sub(1, Ordering::AcqRel);
        Some(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sender_sees_how_far_behind_its_reader_is() {
        const MAX: usize = 5;
        let (tx, mut rx) = channel(MAX);
        for _ in 0..MAX - 1 {
            tx.send(SequenceEvent::Aborted);
        }
        assert!(!tx.is_full());
        tx.send(SequenceEvent::Aborted);
        assert!(tx.is_full());
        assert!(rx.blocking_recv().is_some());
        assert!(!tx.is_full(), "one read: no longer full");
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        // Sends to a reader that left count nothing.
        tx.send(SequenceEvent::Aborted);
        assert!(!tx.is_full());
    }
}
