//! The streaming answer: server-sent events, one chunk per new piece of text (and per
//! token when logprobs are asked for), each choice's last chunk with its finish reason,
//! then the usage chunk if asked for, then `[DONE]`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use ferrite_engine::tokenizer::Tokenizer;
use ferrite_engine::SequenceEvent;
use ferrite_protocol::{ChunkChoice, CompletionChunk, PromptTokensDetails, Usage};
use futures::stream::{self, StreamExt};
use serde_json::Value;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use super::logprobs::LogprobsBuilder;
use super::{finish_fields, Echo, ResponseMeta, SubmittedPrompt};
use crate::error::ApiError;
use crate::validate::GenerateParams;

/// One choice's state while it streams.
struct ChoiceStream {
    /// Which prompt of the request it answers.
    prompt_index: usize,
    echo: Echo,
    echoed: bool,
    logprobs: Option<LogprobsBuilder>,
    generated: usize,
    /// The prompt's ids until the choice's first chunk carries them (`return_token_ids`).
    prompt_token_ids: Option<Vec<u32>>,
}

/// Streams chunks as server-sent events. A task merges the choices' events; when the
/// client goes away the SSE body is dropped, the task's next send fails, and dropping
/// its receivers tells the engine to free the sequences.
pub(super) fn respond(
    meta: ResponseMeta,
    params: Arc<GenerateParams>,
    tokenizer: Arc<Tokenizer>,
    appended_suffix: Option<String>,
    submitted: Vec<SubmittedPrompt>,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    tokio::spawn(
        async move {
            let n = params.n;
            let mut states = Vec::new();
            let mut streams = Vec::new();
            let mut usage = Usage {
                prompt_tokens: submitted.iter().map(|p| p.prompt_tokens).sum(),
                ..Usage::default()
            };
            let prompt_count = submitted.len();
            for prompt in submitted {
                for (j, events) in prompt.events.into_iter().enumerate() {
                    let index = prompt.prompt_index * n + j;
                    states.push((
                        index,
                        ChoiceStream {
                            prompt_index: prompt.prompt_index,
                            echo: prompt.echo.clone(),
                            echoed: !params.output.echo,
                            logprobs: params
                                .output
                                .logprobs
                                .map(|k| LogprobsBuilder::new(params.output.tokens_as_ids, k)),
                            generated: 0,
                            prompt_token_ids: prompt.token_ids.clone(),
                        },
                    ));
                    streams.push(Box::pin(events.into_stream().map(move |e| (index, e))));
                }
            }
            let mut merged = stream::select_all(streams);
            let chunk = |choices: Vec<ChunkChoice>, usage: Option<Usage>| CompletionChunk {
                id: meta.id.clone(),
                object: "text_completion".into(),
                created: meta.created,
                model: meta.model.clone(),
                system_fingerprint: meta.fingerprint.clone(),
                choices,
                usage,
            };
            let return_ids = params.output.return_token_ids;
            // Prompt tokens the prefix cache served, per prompt (the same for each of its
            // choices), known as its choices finish.
            let mut cached: Vec<Option<usize>> = vec![None; prompt_count];
            let text_choice =
                |index, text: String, logprobs: Option<Value>, ids: Vec<u32>| ChunkChoice {
                    index,
                    text,
                    logprobs,
                    finish_reason: None,
                    stop_reason: None,
                    prompt_token_ids: None,
                    token_ids: return_ids.then_some(ids),
                };
            while let Some((index, event)) = merged.next().await {
                let state = &mut states
                    .iter_mut()
                    .find(|(i, _)| *i == index)
                    .expect("every stream has a state")
                    .1;
                let mut out = Vec::new();
                // The echoed prompt goes first, with its logprobs when they come.
                if !state.echoed {
                    state.echoed = true;
                    let echo_chars = state.echo.text.chars().count();
                    let logprobs = match (&event, state.logprobs.as_mut()) {
                        (SequenceEvent::PromptLogprobs(scores), Some(b)) => {
                            b.push_prompt(&tokenizer, scores, &state.echo.token_chars);
                            let taken = b.take();
                            b.set_offset(echo_chars);
                            Some(taken)
                        }
                        _ => None,
                    };
                    out.push(text_choice(
                        index,
                        state.echo.text.clone(),
                        logprobs,
                        Vec::new(),
                    ));
                    if let Some(b) = state.logprobs.as_mut() {
                        b.set_offset(echo_chars);
                    }
                }
                match event {
                    SequenceEvent::PromptLogprobs(_) => {}
                    SequenceEvent::Token {
                        id,
                        logprob,
                        text,
                        top,
                    } => {
                        state.generated += 1;
                        usage.completion_tokens += 1;
                        let logprobs = state.logprobs.as_mut().map(|b| {
                            b.push(&tokenizer, id, logprob, Some(&top), text.chars().count());
                            b.take()
                        });
                        if !text.is_empty() || logprobs.is_some() || return_ids {
                            out.push(text_choice(index, text, logprobs, vec![id]));
                        }
                    }
                    SequenceEvent::Finished {
                        reason,
                        cached_tokens,
                        ..
                    } => {
                        cached[state.prompt_index].get_or_insert(cached_tokens);
                        let (finish_reason, stop_reason) = finish_fields(&reason);
                        out.push(ChunkChoice {
                            index,
                            text: appended_suffix.clone().unwrap_or_default(),
                            logprobs: None,
                            finish_reason: Some(finish_reason),
                            stop_reason: Some(stop_reason.unwrap_or(Value::Null)),
                            prompt_token_ids: None,
                            token_ids: return_ids.then(Vec::new),
                        });
                    }
                    SequenceEvent::Failed(message) => {
                        tracing::error!(message, "sequence failed mid-stream");
                        let _ = tx.send(json_event(&ApiError::Internal.body())).await;
                        return;
                    }
                    SequenceEvent::TimedOut => {
                        let error = ApiError::Timeout(params.inference_timeout.unwrap_or(0.0));
                        let _ = tx.send(json_event(&error.body())).await;
                        return;
                    }
                    SequenceEvent::Aborted => {
                        let _ = tx
                            .send(json_event(&ApiError::shut_down_midway().body()))
                            .await;
                        return;
                    }
                }
                // The choice's first chunk carries the prompt's ids.
                if let Some(first) = out.first_mut() {
                    first.prompt_token_ids = state.prompt_token_ids.take();
                }
                for choice in out {
                    let running = params.continuous_usage.then(|| with_total(usage));
                    if tx
                        .send(json_event(&chunk(vec![choice], running)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
            let mut last = with_total(usage);
            last.prompt_tokens_details = Some(PromptTokensDetails {
                cached_tokens: cached.iter().flatten().sum(),
            });
            if params.include_usage
                && tx
                    .send(json_event(&chunk(Vec::new(), Some(last))))
                    .await
                    .is_err()
            {
                return;
            }
            let _ = tx.send(Event::default().data("[DONE]")).await;
        }
        .instrument(tracing::Span::current()),
    );
    Sse::new(ReceiverStream::new(rx).map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn with_total(mut usage: Usage) -> Usage {
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    usage
}

fn json_event<T: serde::Serialize>(value: &T) -> Event {
    Event::default().data(serde_json::to_string(value).expect("serializable"))
}
