//! The non-streaming answer: every choice collected, `best_of` ranked, echo and suffix
//! applied, usage summed, then written in the route's shape.

use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrite_engine::tokenizer::Tokenizer;
use ferrite_engine::SequenceEvent;
use ferrite_protocol::{
    AssistantMessage, ChatChoice, ChatCompletionResponse, Choice, CompletionResponse,
    PromptTokensDetails, RawJson, Usage,
};
use serde_json::Value;

use super::logprobs::{logprobs_object, prompt_logprobs, LedgerToken, TokenLedger};
use super::reply::{
    chat_finish_reason, chat_logprobs, tool_calls, Dialect, MessageBuilder, ToolOutput,
};
use super::timed::TimedEvents;
use super::{finish_fields, ResponseMeta, SubmittedPrompt};
use crate::error::ApiError;
use crate::validate::GenerateParams;

/// One finished choice, before it takes the route's shape.
struct Finished {
    /// Its index in the answer.
    index: usize,
    /// The text (with echo and suffix).
    text: String,
    /// Its tokens with their log-probabilities, when asked for.
    tokens: Option<Vec<LedgerToken>>,
    finish_reason: String,
    stop_reason: Option<Value>,
    /// vLLM's `prompt_logprobs`, when asked for.
    prompt_logprobs: Option<RawJson>,
    /// With `return_token_ids`: the prompt's ids and the generated ones.
    prompt_token_ids: Option<Vec<u32>>,
    token_ids: Option<Vec<u32>>,
}

/// One finished sequence.
struct Collected {
    finished: Finished,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
    /// Mean log-probability of its tokens, the `best_of` ranking.
    mean_logprob: f64,
}

/// Waits for every choice and answers with the JSON body.
pub(super) async fn respond(
    meta: ResponseMeta,
    params: &GenerateParams,
    tokenizer: &Tokenizer,
    appended_suffix: Option<String>,
    submitted: Vec<SubmittedPrompt>,
    dialect: &Dialect,
) -> Result<Response, ApiError> {
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
            r.finished.index = prompt.prompt_index * params.n + j;
            if let Some(suffix) = &appended_suffix {
                r.finished.text.push_str(suffix);
            }
            choices.push(r.finished);
        }
    }
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    usage.prompt_tokens_details = Some(PromptTokensDetails { cached_tokens });
    let k = params.output.logprobs.unwrap_or(0);
    let as_ids = params.output.tokens_as_ids;
    Ok(match dialect {
        Dialect::Text => Json(CompletionResponse {
            id: meta.id,
            object: "text_completion".into(),
            created: meta.created,
            model: meta.model,
            system_fingerprint: meta.fingerprint,
            choices: choices
                .into_iter()
                .map(|c| Choice {
                    index: c.index,
                    text: c.text,
                    logprobs: c.tokens.map(|t| logprobs_object(tokenizer, &t, k, as_ids)),
                    finish_reason: Some(c.finish_reason),
                    stop_reason: c.stop_reason,
                    prompt_logprobs: c.prompt_logprobs,
                    prompt_token_ids: c.prompt_token_ids,
                    token_ids: c.token_ids,
                })
                .collect(),
            usage,
        })
        .into_response(),
        Dialect::Chat(output) => {
            let first = choices.first();
            let prompt_logprobs = first.and_then(|c| c.prompt_logprobs.clone());
            let prompt_token_ids = first.and_then(|c| c.prompt_token_ids.clone());
            Json(ChatCompletionResponse {
                id: meta.id,
                object: "chat.completion".into(),
                created: meta.created,
                model: meta.model,
                system_fingerprint: meta.fingerprint,
                choices: choices
                    .into_iter()
                    .map(|c| chat_choice(c, output, tokenizer, k, as_ids))
                    .collect(),
                usage,
                prompt_logprobs,
                prompt_token_ids,
            })
            .into_response()
        }
    })
}

/// A finished choice as a chat message.
fn chat_choice(
    c: Finished,
    output: &ToolOutput,
    tokenizer: &Tokenizer,
    alternatives: usize,
    as_ids: bool,
) -> ChatChoice {
    let (content, calls) = MessageBuilder::whole(output, &c.text);
    let called = !calls.is_empty();
    ChatChoice {
        index: c.index,
        message: AssistantMessage {
            role: "assistant".into(),
            content,
            refusal: None,
            tool_calls: tool_calls(calls),
        },
        logprobs: c
            .tokens
            .map(|t| chat_logprobs(tokenizer, &t, alternatives, as_ids)),
        finish_reason: Some(chat_finish_reason(c.finish_reason, called, output)),
        stop_reason: c.stop_reason,
        token_ids: c.token_ids,
    }
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
                return Ok(Collected {
                    finished: Finished {
                        index: 0,
                        text,
                        tokens: ledger.as_mut().map(TokenLedger::take_all),
                        finish_reason,
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
