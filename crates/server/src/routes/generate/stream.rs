//! The streaming answer: server-sent events, one chunk per new piece of text (and per
//! token when logprobs are asked for), each choice's last chunk with its finish reason,
//! then the usage chunk if asked for, then `[DONE]`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use ferrite_engine::tokenizer::Tokenizer;
use ferrite_engine::SequenceEvent;
use ferrite_protocol::{
    ChatChunkChoice, ChatCompletionChunk, ChatDelta, ChunkChoice, CompletionChunk,
    FunctionCallDelta, PromptTokensDetails, ToolCallDelta, Usage,
};
use futures::stream::{self, StreamExt};
use serde_json::Value;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use super::logprobs::{logprobs_object, LedgerToken, TokenLedger};
use super::reply::{
    chat_finish_reason, chat_logprobs, tool_calls, Dialect, MessageBuilder, ToolOutput,
};
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
    /// Its message as it forms, on the chat route.
    chat: Option<ChatChoiceState>,
}

/// Something new for one choice: text, the tokens it came from, and on its last piece
/// the finish reason and vLLM's stop reason.
struct Piece {
    text: String,
    tokens: Vec<LedgerToken>,
    finish: Option<(String, Value)>,
}

/// A chat choice's state while it streams.
struct ChatChoiceState {
    /// Whether its first chunk, with the role, went out.
    started: bool,
    /// Its text becoming a message (until the choice ends).
    builder: Option<MessageBuilder>,
    /// Tokens whose text is held back (a possible tool call), sent with the next chunk.
    pending: Vec<LedgerToken>,
}

impl ChatChoiceState {
    fn new(output: &ToolOutput) -> Self {
        Self {
            started: false,
            builder: Some(MessageBuilder::new(output)),
            pending: Vec::new(),
        }
    }
}

/// Writes pieces as chunks in the route's shape.
struct ChunkWriter {
    meta: ResponseMeta,
    params: Arc<GenerateParams>,
    tokenizer: Arc<Tokenizer>,
    dialect: Dialect,
}

impl ChunkWriter {
    /// The events for `piece` of the choice `index` (whose chat state is `chat` on the
    /// chat route); `prompt_token_ids` on a choice's first, `running` usage on each with
    /// `continuous_usage_stats`.
    fn write(
        &self,
        index: usize,
        chat: Option<&mut ChatChoiceState>,
        piece: Piece,
        prompt_token_ids: Option<Vec<u32>>,
        running: Option<Usage>,
    ) -> Vec<Event> {
        match (&self.dialect, chat) {
            (Dialect::Chat(output), Some(chat)) => {
                let mut ids = prompt_token_ids;
                self.chat_choices(index, chat, piece, output)
                    .into_iter()
                    .map(|choice| self.chat_chunk(vec![choice], running, ids.take()))
                    .collect()
            }
            // (A chat choice always has its state.)
            _ => {
                let choice = self.text_choice(index, piece, prompt_token_ids);
                vec![self.text_chunk(vec![choice], running)]
            }
        }
    }

    /// The last event with `include_usage`: no choices, the usage.
    fn usage(&self, usage: Usage) -> Event {
        match self.dialect {
            Dialect::Text => self.text_chunk(Vec::new(), Some(usage)),
            Dialect::Chat(_) => self.chat_chunk(Vec::new(), Some(usage), None),
        }
    }

    fn text_chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> Event {
        json_event(&CompletionChunk {
            id: self.meta.id.clone(),
            object: "text_completion".into(),
            created: self.meta.created,
            model: self.meta.model.clone(),
            system_fingerprint: self.meta.fingerprint.clone(),
            choices,
            usage,
        })
    }

    fn chat_chunk(
        &self,
        choices: Vec<ChatChunkChoice>,
        usage: Option<Usage>,
        prompt_token_ids: Option<Vec<u32>>,
    ) -> Event {
        json_event(&ChatCompletionChunk {
            id: self.meta.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.meta.created,
            model: self.meta.model.clone(),
            system_fingerprint: self.meta.fingerprint.clone(),
            choices,
            usage,
            prompt_token_ids,
        })
    }

    fn text_choice(
        &self,
        index: usize,
        piece: Piece,
        prompt_token_ids: Option<Vec<u32>>,
    ) -> ChunkChoice {
        let output = &self.params.output;
        let (finish_reason, stop_reason) = match piece.finish {
            Some((reason, stop)) => (Some(reason), Some(stop)),
            None => (None, None),
        };
        ChunkChoice {
            index,
            text: piece.text,
            logprobs: output
                .logprobs
                .filter(|_| !piece.tokens.is_empty())
                .map(|k| logprobs_object(&self.tokenizer, &piece.tokens, k, output.tokens_as_ids)),
            finish_reason,
            stop_reason,
            prompt_token_ids,
            token_ids: output
                .return_token_ids
                .then(|| generated_ids(&piece.tokens)),
        }
    }

    /// A chat choice's chunks for `piece`: the role first, then content as it may go
    /// out, and at the end what was held (content, tool calls) and the finish reason.
    fn chat_choices(
        &self,
        index: usize,
        state: &mut ChatChoiceState,
        piece: Piece,
        output: &ToolOutput,
    ) -> Vec<ChatChunkChoice> {
        let params = &self.params.output;
        let mut out = Vec::new();
        let choice = |delta: ChatDelta, tokens: Vec<LedgerToken>| ChatChunkChoice {
            index,
            delta,
            logprobs: params
                .logprobs
                .filter(|_| !tokens.is_empty())
                .map(|k| chat_logprobs(&self.tokenizer, &tokens, k, params.tokens_as_ids)),
            finish_reason: None,
            stop_reason: None,
            token_ids: params.return_token_ids.then(|| generated_ids(&tokens)),
        };
        if !state.started {
            state.started = true;
            out.push(choice(
                ChatDelta {
                    role: Some("assistant".into()),
                    content: Some(String::new()),
                    tool_calls: None,
                },
                Vec::new(),
            ));
        }
        let builder = state
            .builder
            .as_mut()
            .expect("a builder until the choice ends");
        let mut content = builder.push(&piece.text);
        state.pending.extend(piece.tokens);
        let Some((reason, stop)) = piece.finish else {
            if !content.is_empty() {
                let tokens = std::mem::take(&mut state.pending);
                out.push(choice(content_delta(content), tokens));
            }
            return out;
        };
        let held = state.builder.take().expect("finished once").finish();
        content.push_str(held.content.as_deref().unwrap_or_default());
        if !content.is_empty() {
            let tokens = std::mem::take(&mut state.pending);
            out.push(choice(content_delta(content), tokens));
        }
        let called = !held.calls.is_empty();
        if called {
            let calls = tool_calls(held.calls)
                .into_iter()
                .enumerate()
                .map(|(i, call)| ToolCallDelta {
                    index: i,
                    id: Some(call.id),
                    kind: Some(call.kind),
                    function: FunctionCallDelta {
                        name: Some(call.function.name),
                        arguments: call.function.arguments,
                    },
                })
                .collect();
            let tokens = std::mem::take(&mut state.pending);
            out.push(choice(
                ChatDelta {
                    tool_calls: Some(calls),
                    ..ChatDelta::default()
                },
                tokens,
            ));
        }
        let mut last = choice(ChatDelta::default(), std::mem::take(&mut state.pending));
        last.finish_reason = Some(chat_finish_reason(reason, called, output));
        last.stop_reason = Some(stop);
        out.push(last);
        out
    }
}

fn content_delta(content: String) -> ChatDelta {
    ChatDelta {
        content: Some(content),
        ..ChatDelta::default()
    }
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
    dialect: Dialect,
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
                            chat: match &dialect {
                                Dialect::Chat(output) => Some(ChatChoiceState::new(output)),
                                Dialect::Text => None,
                            },
                        },
                    ));
                    streams.push(Box::pin(events.into_stream().map(move |e| (index, e))));
                }
            }
            let mut merged = stream::select_all(streams);
            let writer = ChunkWriter {
                meta,
                params: Arc::clone(&params),
                tokenizer,
                dialect,
            };
            // Prompt tokens the prefix cache served, per prompt (the same for each of its
            // choices), known as its choices finish.
            let mut cached: Vec<Option<usize>> = vec![None; prompt_count];
            let text_piece = |text: String, tokens: Vec<LedgerToken>| Piece {
                text,
                tokens,
                finish: None,
            };
            loop {
                // A client that left is noticed while no event comes (a long prefill), not
                // only at the next send: its sequences are freed at once.
                let next = tokio::select! {
                    next = merged.next() => next,
                    _ = tx.closed() => return,
                };
                let Some((index, event)) = next else {
                    break;
                };
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
                    out.push(text_piece(echo.text, ready));
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
                            out.push(text_piece(text, ready));
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
                        out.push(Piece {
                            text: appended_suffix.clone().unwrap_or_default(),
                            tokens: rest,
                            finish: Some((finish_reason, stop_reason.unwrap_or(Value::Null))),
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
                for (i, piece) in out.into_iter().enumerate() {
                    // The choice's first chunk carries the prompt's ids.
                    let ids = if i == 0 {
                        state.prompt_token_ids.take()
                    } else {
                        None
                    };
                    let running = params.continuous_usage.then(|| with_total(usage));
                    for event in writer.write(index, state.chat.as_mut(), piece, ids, running) {
                        if tx.send(event).await.is_err() {
                            return;
                        }
                    }
                }
            }
            let mut last = with_total(usage);
            last.prompt_tokens_details = Some(PromptTokensDetails {
                cached_tokens: cached.iter().flatten().sum(),
            });
            if params.include_usage && tx.send(writer.usage(last)).await.is_err() {
                return;
            }
            let _ = tx.send(Event::default().data("[DONE]")).await;
        }
        .instrument(tracing::Span::current()),
    );
    // A comment line every second while nothing else goes out (a long prefill, a wait for
    // admission): writing is how a client that has left is noticed, and its sequences
    // freed, before they cost a whole prefill.
    Sse::new(ReceiverStream::new(rx).map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(1)))
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
