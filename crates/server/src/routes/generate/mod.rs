//! `POST /v1/completions` and `POST /v1/chat/completions`, one pipeline: parse →
//! validate (the same validator: a chat request is a completion request whose prompt is
//! rendered from its messages) → prepare (tokenize, context rules) → submit one group of
//! sequences per prompt → answer with one JSON body or a stream of events, written in
//! the route's shape ([`reply::Dialect`]).

pub(crate) mod chat;
mod collect;
mod logprobs;
mod prepare;
pub(crate) use prepare::encode_with_images;
mod reply;
mod stream;
mod timed;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use crate::routes::body::RawBody;
use crate::routes::cancel::CancelOnDrop;
use axum::extract::State;
use axum::response::Response;
use ferrite_engine::{EngineHandle, FinishReason};
use serde_json::Value;

use crate::error::ApiError;
use crate::images::{check_count, ImageInput};
use crate::media;
use crate::state::{unix_now, AppState};
use crate::validate::{parse_body, GenerateParams, PromptInput};
use prepare::{Echo, Prepared};
use reply::Dialect;
use timed::TimedEvents;

/// One prompt's submitted sequences and what its choices repeat.
struct SubmittedPrompt {
    /// The prompt's position in the request.
    prompt_index: usize,
    /// What `echo` prepends.
    echo: Echo,
    /// Its token ids, for `return_token_ids`.
    token_ids: Option<Vec<u32>>,
    /// Its length in tokens.
    prompt_tokens: usize,
    /// Event streams of its sequences (`best_of` of them).
    events: Vec<TimedEvents>,
}

/// What every body or chunk of one response repeats.
struct ResponseMeta {
    id: String,
    created: u64,
    model: String,
    fingerprint: String,
}

/// Handles `POST /v1/completions`.
pub async fn completions(
    State(state): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let engine = state.engine()?.clone();
    let request = parse_body(&body, state.ignore_unknown_fields)?;
    let params = GenerateParams::new(request, &state.limits.fields)?;
    run(&state, engine, params, arrived, Dialect::Text, "cmpl").await
}

/// A request's images before its prompt is prepared (both completion routes and
/// `/tokenize`): their count checked (a 400 naming `count_field`), and, for a model that
/// reads images, those given by URL fetched. Before the heavy turn: a slow image server
/// holds only its own request.
pub(crate) async fn fetch_images(
    state: &AppState,
    engine: &EngineHandle,
    images: &mut [ImageInput],
    count_field: &str,
    cancelled: &Arc<AtomicBool>,
) -> Result<(), ApiError> {
    check_count(count_field, images.len(), &state.limits.images)?;
    // Not for a model that reads no images: the prompt's preparation refuses them.
    if engine.vision().is_none() {
        return Ok(());
    }
    let (fetcher, max_bytes) = (state.media.as_ref(), state.limits.max_body_bytes);
    media::fetch_urls(images, fetcher, max_bytes, cancelled).await
}

/// The pipeline both routes share once the request is validated: the server's limits,
/// grammar compiled and prompts prepared off the async workers, sequences submitted,
/// then the answer in the route's shape (`id_prefix` starts its id).
async fn run(
    state: &Arc<AppState>,
    engine: EngineHandle,
    mut params: GenerateParams,
    arrived: Instant,
    dialect: Dialect,
    id_prefix: &str,
) -> Result<Response, ApiError> {
    state.check_model(&params.model)?;
    if let Some(limit) = state.request_timeout {
        let limit = limit.as_secs_f64();
        params.inference_timeout = Some(params.inference_timeout.map_or(limit, |t| t.min(limit)));
    }
    if let Some(user) = &params.user {
        tracing::info!(user, "completion request");
    }
    // A client that leaves stops the fetching of its images and the tokenization of its
    // prompts.
    let (_guard, cancelled) = CancelOnDrop::new();
    fetch_images(state, &engine, &mut params.images, "images", &cancelled).await?;
    let params = Arc::new(params);
    if let Some(c) = &params.constraint {
        let (len, max) = (c.grammar.source.len(), state.limits.max_grammar_bytes);
        if len > max {
            return Err(ApiError::invalid(
                c.field,
                format!("`{}` makes a grammar of {len} bytes; at most {max} are allowed (`--max-grammar-bytes`)", c.field),
            ));
        }
    }
    // Grammars compile, and long prompts tokenize, a few at a time, whatever the number
    // of clients sending them.
    let text_bytes = params.prompts.iter().map(PromptInput::text_bytes).sum();
    let heavy = state
        .heavy_turn(text_bytes, params.constraint.is_some())
        .await?;
    let prepared = {
        let (params, engine, limits) = (Arc::clone(&params), engine.clone(), state.limits);
        tokio::task::spawn_blocking(move || {
            let constraint = match &params.constraint {
                Some(c) => match engine.compile_grammar(&c.grammar) {
                    Ok(compiled) => Some(compiled),
                    Err(e) if c.best_effort => {
                        tracing::warn!(error = %e, "tool calls left unconstrained: their grammar does not compile");
                        None
                    }
                    Err(e) => {
                        return Err(ApiError::invalid(
                            c.field,
                            format!("invalid `{}`: {e}", c.field),
                        ))
                    }
                },
                None => None,
            };
            prepare::prepare(
                &params,
                &engine,
                &limits,
                constraint,
                &cancelled,
            )
        })
        .await
        .map_err(|_| ApiError::Internal)??
    };
    drop(heavy);
    let Prepared {
        prompts,
        appended_suffix,
    } = prepared;
    let (texts, groups): (Vec<_>, Vec<_>) = prompts
        .into_iter()
        .map(|p| ((p.echo, p.token_ids, p.prompt_tokens), p.requests))
        .unzip();
    let submitted: Vec<SubmittedPrompt> = texts
        .into_iter()
        .zip(engine.submit_groups(groups)?)
        .enumerate()
        .map(
            |(prompt_index, ((echo, token_ids, prompt_tokens), events))| SubmittedPrompt {
                prompt_index,
                echo,
                token_ids,
                prompt_tokens,
                events: events
                    .into_iter()
                    .map(|rx| TimedEvents::new(rx, Arc::clone(state), arrived))
                    .collect(),
            },
        )
        .collect();
    let meta = ResponseMeta {
        id: format!("{id_prefix}-{:032x}", rand::random::<u128>()),
        created: unix_now(),
        model: state.model_name().to_string(),
        fingerprint: state.fingerprint.clone(),
    };
    let tokenizer = Arc::clone(engine.tokenizer());
    if params.stream {
        Ok(stream::respond(
            meta,
            params,
            tokenizer,
            appended_suffix,
            submitted,
            dialect,
        ))
    } else {
        collect::respond(
            meta,
            &params,
            &tokenizer,
            appended_suffix,
            submitted,
            &dialect,
        )
        .await
    }
}

/// `finish_reason` and vLLM's `stop_reason` for a finish.
fn finish_fields(reason: &FinishReason) -> (String, Option<Value>) {
    match reason {
        FinishReason::EndOfSequence(_) => ("stop".into(), None),
        FinishReason::StopToken(id) => ("stop".into(), Some(Value::from(*id))),
        FinishReason::GrammarComplete => ("stop".into(), None),
        // Cut by a limit like `max_tokens`: the text is incomplete.
        FinishReason::GrammarLimit(_) => ("length".into(), None),
        FinishReason::StopString(s) => ("stop".into(), Some(Value::String(s.clone()))),
        FinishReason::Length => ("length".into(), None),
    }
}
