//! `POST /v1/completions`: parse → validate → tokenize → submit one sequence per choice →
//! answer with one JSON body or a server-sent event stream.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::{EngineHandle, FinishReason, SequenceEvent, SequenceRequest};
use ferrite_protocol::{Choice, ChunkChoice, CompletionChunk, CompletionResponse, Usage};
use futures::stream::{self, StreamExt};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};

use crate::error::ApiError;
use crate::state::{unix_now, AppState};
use crate::validate::{parse_body, GenerateParams, PromptInput, DEFAULT_MAX_TOKENS};

/// One submitted choice: its index and the engine's event stream for it.
struct Submitted {
    index: usize,
    events: UnboundedReceiver<SequenceEvent>,
}

/// Handles `POST /v1/completions`.
pub async fn completions(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let engine = state.engine()?.clone();
    let params = GenerateParams::try_from(parse_body(&body, state.ignore_unknown_fields)?)?;
    state.check_model(&params.model)?;
    if let Some(user) = &params.user {
        tracing::info!(user, "completion request");
    }
    let prompts = tokenize(&engine, params.prompts.clone()).await?;
    let submitted = submit(&engine, &params, prompts)?;
    let meta = ResponseMeta {
        id: format!("cmpl-{:032x}", rand::random::<u128>()),
        created: unix_now(),
        model: state.model_name().to_string(),
        fingerprint: state.fingerprint.clone(),
    };
    if params.stream {
        Ok(stream_response(meta, params.n, params.include_usage, submitted).into_response())
    } else {
        Ok(Json(collect_response(meta, params.n, submitted).await?).into_response())
    }
}

/// Turns the prompts into token ids, off the async workers (long prompts take a while).
async fn tokenize(
    engine: &EngineHandle,
    prompts: Vec<PromptInput>,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let tokenizer = Arc::clone(engine.tokenizer());
    tokio::task::spawn_blocking(move || {
        prompts
            .into_iter()
            .map(|p| match p {
                PromptInput::Text(t) => tokenizer.encode_prompt(&t),
                PromptInput::Tokens(ids) => ids,
            })
            .collect()
    })
    .await
    .map_err(|_| ApiError::Internal)
}

/// Expands prompts × n into sequences and submits them; choice `index = prompt_i * n + j`.
fn submit(
    engine: &EngineHandle,
    params: &GenerateParams,
    prompts: Vec<Vec<u32>>,
) -> Result<Vec<Submitted>, ApiError> {
    let context = engine.context_length();
    let base_seed = params.seed.unwrap_or_else(rand::random);
    let mut submitted = Vec::with_capacity(prompts.len() * params.n);
    for (p, prompt) in prompts.into_iter().enumerate() {
        if prompt.is_empty() {
            return Err(ApiError::invalid("prompt", "the prompt is empty"));
        }
        if prompt.len() >= context {
            return Err(ApiError::invalid(
                "prompt",
                format!(
                    "This model's maximum context length is {context} tokens, but the prompt has {} tokens",
                    prompt.len()
                ),
            ));
        }
        // Default behaviour `truncate`: the completion is shortened to fit the context.
        let room = context - prompt.len();
        let max_tokens = params.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).min(room);
        for j in 0..params.n {
            let index = p * params.n + j;
            let request = SequenceRequest {
                prompt: prompt.clone(),
                sampling: SamplingParams {
                    temperature: params.temperature,
                    top_p: params.top_p,
                    top_k: params.top_k,
                    seed: choice_seed(base_seed, index),
                },
                max_tokens,
                stop: params.stop.clone(),
                ignore_eos: params.ignore_eos,
            };
            let events = engine.submit(request)?;
            submitted.push(Submitted { index, events });
        }
    }
    Ok(submitted)
}

/// A distinct, reproducible seed per choice (SplitMix64 of the request seed and index),
/// so choice 0 of a seeded request is the same whatever `n` is.
fn choice_seed(base: u64, index: usize) -> u64 {
    let mut z = base.wrapping_add((index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What every body or chunk of one response repeats.
struct ResponseMeta {
    id: String,
    created: u64,
    model: String,
    fingerprint: String,
}

/// `finish_reason` and vLLM's `stop_reason` for a finish.
fn finish_fields(reason: &FinishReason) -> (String, Option<Value>) {
    match reason {
        FinishReason::EndOfSequence(_) => ("stop".into(), None),
        FinishReason::StopString(s) => ("stop".into(), Some(Value::String(s.clone()))),
        FinishReason::Length => ("length".into(), None),
    }
}

/// Waits for every choice and builds the JSON body.
async fn collect_response(
    meta: ResponseMeta,
    n: usize,
    submitted: Vec<Submitted>,
) -> Result<CompletionResponse, ApiError> {
    let results = futures::future::join_all(submitted.into_iter().map(collect_choice)).await;
    let mut choices = Vec::with_capacity(results.len());
    let mut usage = Usage::default();
    for result in results {
        let (choice, prompt_tokens, completion_tokens) = result?;
        if choice.index % n == 0 {
            usage.prompt_tokens += prompt_tokens;
        }
        usage.completion_tokens += completion_tokens;
        choices.push(choice);
    }
    choices.sort_by_key(|c| c.index);
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
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

async fn collect_choice(mut s: Submitted) -> Result<(Choice, usize, usize), ApiError> {
    let mut text = String::new();
    while let Some(event) = s.events.recv().await {
        match event {
            SequenceEvent::Token { text: t, .. } => text.push_str(&t),
            SequenceEvent::Finished {
                reason,
                prompt_tokens,
                completion_tokens,
            } => {
                let (finish_reason, stop_reason) = finish_fields(&reason);
                let choice = Choice {
                    index: s.index,
                    text,
                    logprobs: None,
                    finish_reason: Some(finish_reason),
                    stop_reason,
                };
                return Ok((choice, prompt_tokens, completion_tokens));
            }
            SequenceEvent::Failed(message) => {
                tracing::error!(message, "sequence failed");
                return Err(ApiError::Internal);
            }
        }
    }
    tracing::error!("the engine dropped a sequence without finishing it");
    Err(ApiError::Internal)
}

/// Streams chunks as server-sent events. A task merges the choices' events; when the
/// client goes away the SSE body is dropped, the task's next send fails, and dropping
/// its receivers tells the engine to free the sequences.
fn stream_response(
    meta: ResponseMeta,
    n: usize,
    include_usage: bool,
    submitted: Vec<Submitted>,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let streams = submitted.into_iter().map(|s| {
            let index = s.index;
            UnboundedReceiverStream::new(s.events).map(move |e| (index, e))
        });
        let mut merged = stream::select_all(streams);
        let mut usage = Usage::default();
        let chunk = |choices: Vec<ChunkChoice>, usage: Option<Usage>| CompletionChunk {
            id: meta.id.clone(),
            object: "text_completion".into(),
            created: meta.created,
            model: meta.model.clone(),
            system_fingerprint: meta.fingerprint.clone(),
            choices,
            usage,
        };
        while let Some((index, event)) = merged.next().await {
            let choice = match event {
                SequenceEvent::Token { text, .. } if text.is_empty() => continue,
                SequenceEvent::Token { text, .. } => ChunkChoice {
                    index,
                    text,
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                },
                SequenceEvent::Finished {
                    reason,
                    prompt_tokens,
                    completion_tokens,
                } => {
                    if index % n == 0 {
                        usage.prompt_tokens += prompt_tokens;
                    }
                    usage.completion_tokens += completion_tokens;
                    let (finish_reason, stop_reason) = finish_fields(&reason);
                    ChunkChoice {
                        index,
                        text: String::new(),
                        logprobs: None,
                        finish_reason: Some(finish_reason),
                        stop_reason: Some(stop_reason.unwrap_or(Value::Null)),
                    }
                }
                SequenceEvent::Failed(message) => {
                    tracing::error!(message, "sequence failed mid-stream");
                    let body = ApiError::Internal.body();
                    let _ = tx.send(json_event(&body)).await;
                    return;
                }
            };
            if tx
                .send(json_event(&chunk(vec![choice], None)))
                .await
                .is_err()
            {
                return;
            }
        }
        if include_usage {
            usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
            if tx
                .send(json_event(&chunk(Vec::new(), Some(usage))))
                .await
                .is_err()
            {
                return;
            }
        }
        let _ = tx.send(Event::default().data("[DONE]")).await;
    });
    Sse::new(ReceiverStream::new(rx).map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn json_event<T: serde::Serialize>(value: &T) -> Event {
    Event::default().data(serde_json::to_string(value).expect("serializable"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_seeds_differ_and_are_stable() {
        assert_eq!(choice_seed(7, 0), choice_seed(7, 0));
        assert_ne!(choice_seed(7, 0), choice_seed(7, 1));
        assert_ne!(choice_seed(7, 0), choice_seed(8, 0));
    }
}
