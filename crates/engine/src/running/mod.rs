//! One sequence's life inside the engine: its tokens, cache, sampler, text, stop and
//! draft state, and the events it sends back.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::constrain::{Constraint, MaskError};
use crate::kv_cache::SequenceCache;
use crate::lookup::{self, DraftLength, PromptLookup};
use crate::model::Logits;
use crate::sampling::{log_sum_exp, top_k, Sampler};
use crate::sequence::{EventSender, FinishReason, PromptLogprob, SequenceEvent, SequenceRequest};
use crate::stop::{StopCheck, StopMatcher};
use crate::tokenizer::{IncrementalDecoder, TokenId, Tokenizer};
use crate::vision::prompt::is_image_token;

use crate::lookup::MAX_DRAFT;

mod images;
pub(crate) use images::SequenceImage;

/// Most forced tokens kept as drafts at once (a long forced run is taken in pieces).
const MAX_FORCED_DRAFT: usize = 256;

/// Longest one sequence's sampling of one token may take (its grammar's mask, penalties,
/// stop strings) before the engine's watchdog ends that sequence with an error. Every
/// such piece of work is bounded well below this; the bound catches what is not.
pub(crate) const TOKEN_WORK_LIMIT: Duration = Duration::from_millis(1500);

/// Choices that share a sequence's prompt: they start from its cache once its prompt is
/// in, instead of computing the prompt again.
pub(crate) type Followers = Vec<(SequenceRequest, EventSender)>;

/// A sequence's prompt lookup (see [`crate::lookup`]).
struct LookupState {
    config: PromptLookup,
    length: DraftLength,
    /// Whether the pending draft came from the lookup (and not from a prediction or a
    /// grammar's forced tokens).
    drafted: bool,
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
    stop_token_ids: Vec<TokenId>,
    ignore_eos: bool,
    min_tokens: usize,
    top_logprobs: Option<usize>,
    token_logprobs: bool,
    skip_special_tokens: bool,
    prompt_logprobs: Option<usize>,
    prompt_scores: Vec<PromptLogprob>,
    /// Prompt tokens that came from the prefix cache at admission.
    pub(crate) cached_tokens: usize,
    /// Steps in a row that left this sequence's pending prompt without a token
    /// ([`crate::scheduler::RunningView::passed_over`]).
    pub(crate) passed_over: usize,
    allowed_tokens: Option<Arc<[TokenId]>>,
    draft: VecDeque<TokenId>,
    lookup: Option<LookupState>,
    deadline: Option<Instant>,
    constraint: Option<Constraint>,
    pub(crate) followers: Followers,
    events: EventSender,
    /// Since when its reader has been too far behind for it to go on, if it is.
    pub(crate) blocked_since: Option<Instant>,
    /// The submission it belongs to (its followers too), for admission's fairness.
    pub(crate) request: u64,
    /// Its prompt's images, in prompt order.
    pub(crate) images: Vec<SequenceImage>,
}

impl Sequence {
    pub(crate) fn new(
        request: SequenceRequest,
        cache: SequenceCache,
        events: EventSender,
        lookup: Option<PromptLookup>,
    ) -> Self {
        let prompt_len = request.prompt.len();
        let prompt_scores = match request.prompt_logprobs {
            Some(_) => vec![PromptLogprob {
                id: request.prompt[0],
                logprob: None,
                rank: None,
                top: Vec::new(),
            }],
            None => Vec::new(),
        };
        Self {
            sampler: Sampler::new(request.sampling, &request.prompt),
            tokens: request.prompt,
            prompt_len,
            cache,
            max_tokens: request.max_tokens,
            decoder: IncrementalDecoder::new(),
            stop: StopMatcher::new(request.stop, request.include_stop_str_in_output),
            stop_token_ids: request.stop_token_ids,
            ignore_eos: request.ignore_eos,
            min_tokens: request.min_tokens,
            top_logprobs: request.top_logprobs,
            token_logprobs: request.token_logprobs,
            skip_special_tokens: request.skip_special_tokens,
            prompt_logprobs: request.prompt_logprobs,
            prompt_scores,
            cached_tokens: 0,
            passed_over: 0,
            allowed_tokens: request.allowed_tokens,
            draft: request.prediction.into(),
            lookup: lookup.map(|config| LookupState {
                config,
                length: DraftLength::new(config.max_draft),
                drafted: false,
            }),
            deadline: request.deadline,
            constraint: request.constraint,
            followers: Vec::new(),
            events,
            blocked_since: None,
            request: 0,
            images: request
                .images
                .into_iter()
                .map(|image| SequenceImage {
                    image,
                    rows: None,
                    bidirectional: false,
                    grid_columns: None,
                    encoding: None,
                })
                .collect(),
        }
    }

    /// KV positions this sequence and its followers may need in all.
    pub(crate) fn reservation(&self) -> usize {
        (self.prompt_len + self.max_tokens)
            + self
                .followers
                .iter()
                .map(|(r, _)| r.kv_need())
                .sum::<usize>()
    }

    /// Prompt tokens not yet in the cache.
    pub(crate) fn pending_prefill(&self) -> usize {
        self.prompt_len.saturating_sub(self.cache.len())
    }

    /// Whether its reader is too far behind for it to generate more now (a decoding
    /// sequence only: a prompt goes on being computed).
    pub(crate) fn is_blocked(&self) -> bool {
        self.pending_prefill() == 0 && self.events.is_full()
    }

    /// Whether nobody waits for this sequence any more: its client and those of the
    /// followers it still carries went away.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.events.is_closed() && self.followers.iter().all(|(_, e)| e.is_closed())
    }

    /// Whether the deadline has passed.
    pub(crate) fn is_late(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    pub(crate) fn completion_tokens(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Most prompt tokens one step may feed it, over a vocabulary of `vocab`: unlimited,
    /// but when every prompt position is scored (`prompt_logprobs`), as many as
    /// `scored_bytes` of logits hold (one at least). A scored 2,048-token prompt over
    /// Gemma 3's 262,144 tokens took 2 GiB of logits and seconds of one step at once before.
    pub(crate) fn max_prefill_chunk(&self, vocab: usize, scored_bytes: usize) -> usize {
        match self.prompt_logprobs {
            Some(_) => (scored_bytes / (vocab.max(1) * 4)).max(1),
            None => usize::MAX,
        }
    }

    /// The tokens this step feeds for a sequence given `n` by the plan: a prompt chunk,
    /// or the last sampled token followed by draft tokens; and which logits it wants.
    pub(crate) fn step_input(&self, n: usize) -> (Vec<TokenId>, Logits) {
        let start = self.cache.len();
        if self.pending_prefill() > 0 {
            let end = self.chunk_end(start, start + n);
            let logits = if self.prompt_logprobs.is_some() {
                Logits::All
            } else if end == self.prompt_len {
                Logits::Last
            } else {
                Logits::None
            };
            return (self.tokens[start..end].to_vec(), logits);
        }
        let mut input = vec![self.tokens[start]];
        // Drafts never run past max_tokens: the last row must still be a real step.
        let room = self
            .max_tokens
            .saturating_sub(self.completion_tokens() + 1)
            .min(MAX_DRAFT);
        input.extend(self.draft.iter().take(room));
        let logits = if input.len() > 1 {
            Logits::All
        } else {
            Logits::Last
        };
        (input, logits)
    }

    /// Takes a prefill chunk's logits rows (as [`Self::step_input`] asked for them; `fed`
    /// tokens went in) and says whether the prompt is now complete.
    pub(crate) fn accept_prefill(&mut self, rows: &[Vec<f32>], fed: usize) -> bool {
        // The forward step already appended the chunk to the cache.
        let first = self.cache.len() - fed;
        if self.prompt_logprobs.is_some() {
            self.score_prompt(first, rows);
        }
        self.cache.len() >= self.prompt_len
    }

    /// Records the log-probability of each prompt token that a row of this chunk predicts.
    fn score_prompt(&mut self, first: usize, rows: &[Vec<f32>]) {
        let k = self.prompt_logprobs.unwrap_or(0);
        for (r, logits) in rows.iter().enumerate() {
            let next = first + r + 1;
            if next >= self.prompt_len {
                break;
            }
            let id = self.tokens[next];
            if is_image_token(id) {
                // An image's position predicts no token.
                self.prompt_scores.push(PromptLogprob {
                    id,
                    logprob: None,
                    rank: None,
                    top: Vec::new(),
                });
                continue;
            }
            let (log_norm, rank) = normaliser_and_rank(logits, id);
            let logprob = logits[id as usize] - log_norm;
            let top = top_logprobs(logits, k, log_norm);
            self.prompt_scores.push(PromptLogprob {
                id,
                logprob: Some(logprob),
                rank: Some(rank),
                top,
            });
        }
    }

    /// The prompt is in: sends the prompt logprobs and samples the first token from the
    /// prompt's last logits, unless nothing is to be generated. Says whether it finished.
    pub(crate) fn complete_prompt(
        &mut self,
        last: &[f32],
        tokenizer: &Tokenizer,
        context: usize,
    ) -> bool {
        if self.prompt_logprobs.is_some() {
            let scores = std::mem::take(&mut self.prompt_scores);
            self.send(SequenceEvent::PromptLogprobs(scores));
        }
        if self.max_tokens == 0 {
            self.finish(FinishReason::Length);
            return true;
        }
        self.accept_logits(last, tokenizer, context)
    }

    /// Starts a follower from this sequence's prompt: same cache, same prompt logprobs,
    /// its first token sampled from the prompt's last logits. Returns it and whether it
    /// already finished.
    pub(crate) fn fork(
        &self,
        request: SequenceRequest,
        events: EventSender,
        last: &[f32],
        prompt_scores: Option<&[PromptLogprob]>,
        tokenizer: &Tokenizer,
        context: usize,
    ) -> (Sequence, bool) {
        let capacity = (request.prompt.len() + request.max_tokens).min(context);
        let cache = self.cache.fork(capacity);
        let lookup = self.lookup.as_ref().map(|l| l.config);
        let mut follower = Sequence::new(request, cache, events, lookup);
        follower.cached_tokens = self.cached_tokens;
        follower.request = self.request;
        // The same images in the same places: the same grids for its later positions.
        for (theirs, ours) in follower.images.iter_mut().zip(&self.images) {
            theirs.grid_columns = ours.grid_columns;
        }
        if let (Some(scores), Some(_)) = (prompt_scores, follower.prompt_logprobs) {
            follower.prompt_scores = scores.to_vec();
        }
        let done = follower.complete_prompt(last, tokenizer, context);
        (follower, done)
    }

    /// The prompt logprobs this sequence computed (before they are sent), for followers.
    pub(crate) fn prompt_scores(&self) -> Option<Vec<PromptLogprob>> {
        self.prompt_logprobs.map(|_| self.prompt_scores.clone())
    }

    /// Drafts the next tokens by prompt lookup, if it is on, the sequence is decoding and
    /// nothing else (a prediction, a grammar's forced tokens) is drafted.
    pub(crate) fn draft_by_lookup(&mut self) {
        let decoding = self.pending_prefill() == 0 && self.completion_tokens() > 0;
        let Some(state) = self.lookup.as_mut() else {
            return;
        };
        if !decoding || !self.draft.is_empty() {
            return;
        }
        let found = lookup::find(&self.tokens, &state.config, state.length.get());
        // An image's placeholders are never a token to draft.
        self.draft
            .extend(found.iter().copied().take_while(|&t| !is_image_token(t)));
        state.drafted = !self.draft.is_empty();
    }

    /// Samples from each row in turn while the sampled token equals the draft token fed
    /// after it (`input` is what the step fed); then drops the cache positions of
    /// rejected drafts.
    pub(crate) fn verify(
        &mut self,
        rows: &[Vec<f32>],
        input: &[TokenId],
        tokenizer: &Tokenizer,
        context: usize,
    ) -> bool {
        let looked_up = self.lookup.as_ref().is_some_and(|l| l.drafted);
        let before = self.tokens.len();
        for (r, logits) in rows.iter().enumerate() {
            if self.accept_logits(logits, tokenizer, context) {
                // The positions after the finishing token's hold draft tokens it did not
                // match, and the prefix cache keeps this cache for later prompts: only
                // what the sequence's tokens computed may stay.
                self.cache.truncate(self.tokens.len() - 1);
                return true;
            }
            let sampled = *self.tokens.last().expect("a token was just sampled");
            if input.get(r + 1) != Some(&sampled) {
                break;
            }
        }
        // Positions whose draft token was not the sampled one hold wrong keys and values.
        self.cache.truncate(self.tokens.len() - 1);
        if let Some(state) = self.lookup.as_mut().filter(|_| looked_up) {
            let accepted = (self.tokens.len() - before).saturating_sub(1);
            state.length.record(input.len() - 1, accepted);
        }
        false
    }

    /// Keeps the prediction in step with the output: a sampled token that is the next
    /// predicted one consumes it; any other ends drafting (the output left the prediction).
    fn follow_prediction(&mut self, sampled: TokenId) {
        if self.draft.front() == Some(&sampled) {
            self.draft.pop_front();
        } else {
            self.draft.clear();
        }
        if let (true, Some(state)) = (self.draft.is_empty(), self.lookup.as_mut()) {
            state.drafted = false;
        }
    }

    /// Tokens that may not come yet: before `min_tokens`, the ones that would end the
    /// sequence.
    fn banned(&self, tokenizer: &Tokenizer) -> Vec<TokenId> {
        if self.completion_tokens() >= self.min_tokens {
            return Vec::new();
        }
        let mut banned = self.stop_token_ids.clone();
        if !self.ignore_eos {
            banned.extend_from_slice(tokenizer.end_of_generation());
        }
        banned
    }

    /// Samples the next token from `logits`, emits its event, and says whether the
    /// sequence is finished. `context` is the model's context length.
    pub(crate) fn accept_logits(
        &mut self,
        logits: &[f32],
        tokenizer: &Tokenizer,
        context: usize,
    ) -> bool {
        let started = Instant::now();
        let banned = self.banned(tokenizer);
        // The row the sampler sees: the grammar's mask, then `allowed_tokens`.
        let mut masked: Option<Vec<f32>> = None;
        if let Some(constraint) = self.constraint.as_mut() {
            let mut row = logits.to_vec();
            // Prepared when the last token was consumed (or at compile time), so this
            // fails only for a constraint nobody prepared.
            if let Err(e) = constraint.mask(&mut row) {
                self.finish(grammar_end(e));
                return true;
            }
            masked = Some(row);
        }
        if let Some(allowed) = &self.allowed_tokens {
            let kept = keep_only(masked.as_deref().unwrap_or(logits), allowed);
            // Where the grammar allows none of them, the grammar wins.
            if kept.iter().any(|&l| l > f32::NEG_INFINITY) {
                masked = Some(kept);
            }
        }
        let id = match &masked {
            Some(row) => {
                // What the masks allow wins over `min_tokens` and stop tokens: when every
                // allowed token is banned, the bans yield.
                let open = row
                    .iter()
                    .enumerate()
                    .any(|(id, &l)| l > f32::NEG_INFINITY && !banned.contains(&(id as TokenId)));
                let banned: &[TokenId] = if open { &banned } else { &[] };
                self.sampler.sample(row, &self.tokens, banned)
            }
            None => self.sampler.sample(logits, &self.tokens, &banned),
        };
        let (logprob, top) = if self.top_logprobs.is_some() || self.token_logprobs {
            let (logprob, top) = token_logprob(logits, id, self.top_logprobs.unwrap_or(0));
            (Some(logprob), top)
        } else {
            (None, Vec::new())
        };
        self.tokens.push(id);
        self.follow_prediction(id);
        // A grammar that cannot take the token (over its limits) ends the sequence with it.
        let grammar_failed = match self.constraint.as_mut() {
            Some(constraint) => constraint.consume(id).err(),
            None => None,
        };
        if started.elapsed() > TOKEN_WORK_LIMIT {
            // The watchdog: whatever made this sequence's token this slow must not hold
            // the other sequences back again.
            tracing::warn!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "one sequence's token took too long; ending it"
            );
            self.send(SequenceEvent::Failed(format!(
                "choosing one token took over {} ms; the request was ended to keep the server responsive",
                TOKEN_WORK_LIMIT.as_millis()
            )));
            return true;
        }
        let stops_allowed = self.completion_tokens() >= self.min_tokens;
        let mut decoded_chars = 0;
        let (mut text, mut finish) = if tokenizer.is_end_of_generation(id) && !self.ignore_eos {
            (self.release_all(), Some(FinishReason::EndOfSequence(id)))
        } else if self.stop_token_ids.contains(&id) {
            (self.release_all(), Some(FinishReason::StopToken(id)))
        } else {
            let bytes = tokenizer.token_bytes(id, !self.skip_special_tokens);
            let delta = self.decoder.push(&bytes);
            decoded_chars = delta.chars().count();
            if stops_allowed {
                match self.stop.push(&delta) {
                    StopCheck::Continue { release } => (release, None),
                    StopCheck::Stopped { release, matched } => {
                        (release, Some(FinishReason::StopString(matched)))
                    }
                }
            } else {
                (self.stop.push_unmatched(&delta), None)
            }
        };
        if let (None, Some(why)) = (&finish, grammar_failed) {
            text.push_str(&self.release_all());
            finish = Some(grammar_end(MaskError::OverLimit(why)));
        }
        if finish.is_none()
            && self
                .constraint
                .as_ref()
                .is_some_and(Constraint::is_complete)
        {
            text.push_str(&self.release_all());
            finish = Some(FinishReason::GrammarComplete);
        }
        if let (None, Some(constraint)) = (&finish, self.constraint.as_mut()) {
            // The next mask now: a grammar that cannot go on ends with this token.
            match constraint.prepare_next() {
                // Tokens the grammar forces are verified as drafts in the next steps.
                // Finding them walks the whole forced run (a `\u{FFFD}{100000}` regex
                // forces 300 kB: ~50 ms), so it is done once per run, when the drafts
                // from the last one are used up, not at every token.
                Ok(()) if self.draft.is_empty() => {
                    let forced = constraint.forced_tokens();
                    self.draft = forced.into_iter().take(MAX_FORCED_DRAFT).collect();
                }
                Ok(()) => {}
                Err(e) => {
                    text.push_str(&self.release_all());
                    finish = Some(grammar_end(e));
                }
            }
        }
        let out_of_room =
            self.completion_tokens() >= self.max_tokens || self.tokens.len() >= context;
        if finish.is_none() && out_of_room {
            text.push_str(&self.release_all());
            finish = Some(FinishReason::Length);
        }
        self.send(SequenceEvent::Token {
            id,
            logprob,
            text,
            decoded_chars,
            top,
        });
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
            cached_tokens: self.cached_tokens,
        };
        self.send(event);
    }

    /// Ends the sequence and its waiting followers with an error.
    pub(crate) fn fail(&mut self, message: String) {
        for (_, events) in self.followers.drain(..) {
            events.send(SequenceEvent::Failed(message.clone()));
        }
        self.send(SequenceEvent::Failed(message));
    }

    /// Ends the sequence and its waiting followers with `event` (`TimedOut` when the
    /// deadline passed, `Aborted` when the engine stops).
    pub(crate) fn end(&mut self, event: SequenceEvent) {
        for (_, events) in self.followers.drain(..) {
            events.send(event.clone());
        }
        self.send(event);
    }

    fn send(&self, event: SequenceEvent) {
        // A closed receiver is noticed by `is_abandoned` on the next step.
        self.events.send(event);
    }
}

/// How a sequence ends when its grammar cannot give a next mask.
fn grammar_end(error: MaskError) -> FinishReason {
    match error {
        MaskError::Nothing => FinishReason::GrammarComplete,
        MaskError::OverLimit(why) => {
            tracing::info!(why, "a grammar went over its limits; its choice ends");
            FinishReason::GrammarLimit(why)
        }
    }
}

/// A copy of `row` where every token but `allowed` is -inf.
fn keep_only(row: &[f32], allowed: &[TokenId]) -> Vec<f32> {
    let mut kept = vec![f32::NEG_INFINITY; row.len()];
    for &id in allowed {
        if let Some(&l) = row.get(id as usize) {
            kept[id as usize] = l;
        }
    }
    kept
}

/// `ln Σ exp(logits)` ([`log_sum_exp`]) and the rank of `id` (1 plus the number of tokens
/// with a higher logit): a prompt's every position is scored, each over the whole
/// vocabulary.
fn normaliser_and_rank(logits: &[f32], id: TokenId) -> (f32, u32) {
    let own = logits[id as usize];
    let above = logits.iter().map(|&l| u32::from(l > own)).sum::<u32>();
    (log_sum_exp(logits), 1 + above)
}

/// The `k` most likely tokens with their log-probabilities under `log_norm`.
fn top_logprobs(logits: &[f32], k: usize, log_norm: f32) -> Vec<(TokenId, f32)> {
    if k == 0 {
        return Vec::new();
    }
    top_k(logits, k)
        .into_iter()
        .map(|c| (c.id, c.value - log_norm))
        .collect()
}

/// The log-probability of `id` under `logits`, and the `k` most likely tokens with theirs.
fn token_logprob(logits: &[f32], id: TokenId, k: usize) -> (f32, Vec<(TokenId, f32)>) {
    let log_norm = log_sum_exp(logits);
    let top = if k > 0 {
        top_k(logits, k)
            .into_iter()
            .map(|c| (c.id, c.value - log_norm))
            .collect()
    } else {
        Vec::new()
    };
    (logits[id as usize] - log_norm, top)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_only_masks_every_other_token() {
        let row = [0.5, 2.0, -1.0, 3.0];
        let kept = keep_only(&row, &[1, 2, 99]);
        assert_eq!(kept, [f32::NEG_INFINITY, 2.0, -1.0, f32::NEG_INFINITY]);
    }

    #[test]
    fn ranks_count_the_tokens_above_and_logprobs_match_the_plain_ones() {
        let row = [0.5, 2.0, -1.0, 3.0, 2.0];
        let rank = |id| normaliser_and_rank(&row, id).1;
        assert_eq!(rank(3), 1);
        // Ties share the better rank.
        assert_eq!((rank(1), rank(4)), (2, 2));
        assert_eq!(rank(2), 5);
        for id in 0..5 {
            let (log_norm, _) = normaliser_and_rank(&row, id);
            let (plain, top) = token_logprob(&row, id, 2);
            assert_eq!((row[id as usize] - log_norm).to_bits(), plain.to_bits());
            assert_eq!(top, top_logprobs(&row, 2, log_norm));
        }
    }
}
