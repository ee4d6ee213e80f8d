//! The non-streaming answer: every choice collected, `best_of` ranked, echo and suffix
//! applied, usage summed.

use ferrite_engine::tokenizer::Tokenizer;
use ferrite_engine::SequenceEvent;
use ferrite_protocol::{Choice, CompletionResponse, PromptTokensDetails, Usage};

use super::logprobs::{logprobs_object, prompt_logprobs, TokenLedger};
use super::timed::TimedEvents;
use super::{finish_fields, ResponseMeta, SubmittedPrompt};
use crate::error::ApiError;
use crate::validate::GenerateParams;

/// One finished sequence.
struct Collected {
    choice: Choice,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
    /// Mean log-probability of its tokens, the `best_of` ranking.
    mean_logprob: f64,
}

/// Waits for every choice and builds the JSON body.
pub(super) async fn respond(
    meta: ResponseMeta,
    params: &GenerateParams,
    tokenizer: &Tokenizer,
    appended_suffix: Option<String>,
    submitted: Vec<SubmittedPrompt>,
) -> Result<CompletionResponse, ApiError> {
    let mut choices = Vec::new();
    let mut usage = Usage::default();
    let mut cached_tokens = 0;
    for mut prompt in submitted {
        let events = std::mem::take(&mut prompt.events);
        let results = futures::future::join_all(
            events
                .into_iter()
                .map(|rx| collect_one(rx, params, tokenizer, &prompt)),
        )
        .await;
        let mut results = results.into_iter().collect::<Result<Vec<_>, _>>()?;
        if let Some(first) = results.first() {
            usage.prompt_tokens += first.prompt_tokens;
            cached_tokens += first.cached_tokens;
        }
        usage.completion_tokens += results.iter().map(|r| r.completion_tokens).sum::<usize>();
        if params.best_of > params.n {
            // Stable: equal means keep generation order.
            results.sort_by(|a, b| b.mean_logprob.total_cmp(&a.mean_logprob));
        }
        for (j, mut r) in results.into_iter().take(params.n).enumerate() {
            r.choice.index = prompt.prompt_index * params.n + j;
            if let Some(suffix) = &appended_suffix {
                r.choice.text.push_str(suffix);
            }
            choices.push(r.choice);
        }
    }
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    usage.prompt_tokens_details = Some(PromptTokensDetails { cached_tokens });
    Ok(CompletionResponse {
        id: meta.id,
        object: "text_completion".into(),
        created: meta.created,
        model: meta.model,
        system_fingerprint: meta.fingerprint,
        choices,
        usage,
    })
}

async fn collect_one(
    mut events: TimedEvents,
    params: &GenerateParams,
    tokenizer: &Tokenizer,
    prompt: &SubmittedPrompt,
) -> Result<Collected, ApiError> {
    let echo = params.output.echo;
    let mut text = prompt.echo.text.clone();
    // With logprobs, every token in order: the echoed prompt's (scored before the first
    // generated token), then the generated ones.
    let mut ledger = params.output.logprobs.map(|_| TokenLedger::new());
    let mut scores = None;
    let mut token_ids = Vec::new();
    let (mut sum, mut count) = (0f64, 0usize);
    while let Some(event) = events.recv().await {
        match event {
            SequenceEvent::PromptLogprobs(prompt_scores) => {
                if let Some(ledger) = ledger.as_mut().filter(|_| echo) {
                    ledger.push_prompt(&prompt_scores, &prompt.echo.token_chars);
                    ledger.release(prompt.echo.text.chars().count());
                }
                if let Some(k) = params.output.prompt_logprobs {
                    scores = Some(prompt_logprobs(tokenizer, &prompt_scores, k));
                }
            }
            SequenceEvent::Token {
                id,
                logprob,
                text: piece,
                decoded_chars,
                top,
            } => {
                if let Some(ledger) = ledger.as_mut() {
                    ledger.push(id, false, logprob, Some(top), decoded_chars);
                    ledger.release(piece.chars().count());
                }
                text.push_str(&piece);
                token_ids.push(id);
                sum += f64::from(logprob.unwrap_or(0.0));
                count += 1;
            }
            SequenceEvent::Finished {
                reason,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            } => {
                let (finish_reason, stop_reason) = finish_fields(&reason);
                let return_ids = params.output.return_token_ids;
                let logprobs = ledger.as_mut().map(|ledger| {
                    let alternatives = params.output.logprobs.unwrap_or(0);
                    let tokens = ledger.take_all();
                    logprobs_object(
                        tokenizer,
                        &tokens,
                        alternatives,
                        params.output.tokens_as_ids,
                    )
                });
                return Ok(Collected {
                    choice: Choice {
                        index: 0,
                        text,
                        logprobs,
                        finish_reason: Some(finish_reason),
                        stop_reason,
                        prompt_logprobs: scores,
                        prompt_token_ids: prompt.token_ids.clone(),
                        token_ids: return_ids.then_some(token_ids),
                    },
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                    mean_logprob: if count == 0 {
                        f64::NEG_INFINITY
                    } else {
                        sum / count as f64
                    },
                });
            }
            SequenceEvent::Failed(message) => {
                tracing::error!(message, "sequence failed");
                return Err(ApiError::Internal);
            }
            SequenceEvent::TimedOut => {
                return Err(ApiError::Timeout(params.inference_timeout.unwrap_or(0.0)));
            }
            SequenceEvent::Aborted => return Err(ApiError::shut_down_midway()),
        }
    }
    tracing::error!("the engine dropped a sequence without finishing it");
    Err(ApiError::Internal)
}
