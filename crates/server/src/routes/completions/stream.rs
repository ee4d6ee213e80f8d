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

use super::logprobs::{logprobs_object, LedgerToken, TokenLedger};
use super::{finish_fields, Echo, ResponseMeta, SubmittedPrompt};
use crate::error::ApiError;
use crate::validate::GenerateParams;

/// One choice's state while it streams.
struct ChoiceStream {
    /// Which prompt of the request it answers.
    prompt_index: usize,
    /// The echo, until the choice's first chunk carries it.
    echo: Option<Echo>,
    /// Its tokens on their way out, with logprobs or `return_token_ids`.
    ledger: Option<TokenLedger>,
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
                            echo: params.output.echo.then(|| prompt.echo.clone()),
                            ledger: (params.output.logprobs.is_some()
                                || params.output.return_token_ids)
                                .then(TokenLedger::new),
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
            // A chunk of one choice: new text, and the tokens it came from.
            let text_choice = |index, text: String, tokens: Vec<LedgerToken>| ChunkChoice {
                index,
                text,
                logprobs: params
                    .output
                    .logprobs
                    .filter(|_| !tokens.is_empty())
                    .map(|k| logprobs_object(&tokenizer, &tokens, k, params.output.tokens_as_ids)),
                finish_reason: None,
                stop_reason: None,
                prompt_token_ids: None,
                token_ids: return_ids.then(|| generated_ids(&tokens)),
            };
            while let Some((index, event)) = merged.next().await {
                let state = &mut states
                    .iter_mut()
                    .find(|(i, _)| *i == index)
                    .expect("every stream has a state")
                    .1;
                let mut out = Vec::new();
                // The echoed prompt goes first, with its logprobs when they come.
                if let Some(echo) = state.echo.take() {
                    let chars = echo.text.chars().count();
                    match (&event, state.ledger.as_mut()) {
                        (SequenceEvent::PromptLogprobs(scores), Some(ledger))
                            if params.output.logprobs.is_some() =>
                        {
                            ledger.push_prompt(scores, &echo.token_chars);
                            ledger.release(chars);
                        }
                        (_, Some(ledger)) => ledger.skip(chars),
                        (_, None) => {}
                    }
                    let ready = state
                        .ledger
                        .as_mut()
                        .map(TokenLedger::take_ready)
                        .unwrap_or_default();
                    out.push(text_choice(index, echo.text, ready));
                }
                match event {
                    SequenceEvent::PromptLogprobs(_) => {}
                    SequenceEvent::Token {
                        id,
                        logprob,
                        text,
                        decoded_chars,
                        top,
                    } => {
                        usage.completion_tokens += 1;
                        let ready = match state.ledger.as_mut() {
                            Some(ledger) => {
                                ledger.push(id, false, logprob, Some(top), decoded_chars);
                                ledger.release(text.chars().count());
                                ledger.take_ready()
                            }
                            None => Vec::new(),
                        };
                        if !text.is_empty() || !ready.is_empty() {
                            out.push(text_choice(index, text, ready));
                        }
                    }
                    SequenceEvent::Finished {
                        reason,
                        cached_tokens,
                        ..
                    } => {
                        cached[state.prompt_index].get_or_insert(cached_tokens);
                        let (finish_reason, stop_reason) = finish_fields(&reason);
                        // Tokens whose text never came out (a stop string's) end here.
                        let rest = state
                            .ledger
                            .as_mut()
                            .map(TokenLedger::take_all)
                            .unwrap_or_default();
                        let mut last =
                            text_choice(index, appended_suffix.clone().unwrap_or_default(), rest);
                        last.finish_reason = Some(finish_reason);
                        last.stop_reason = Some(stop_reason.unwrap_or(Value::Null));
                        out.push(last);
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

/// The ids of the generated tokens among `tokens` (`return_token_ids`).
fn generated_ids(tokens: &[LedgerToken]) -> Vec<u32> {
    tokens.iter().filter(|t| !t.prompt).map(|t| t.id).collect()
}
