//! `POST /v1/completions`: parse → validate → prepare (tokenize, context rules) → submit
//! one group of sequences per prompt → answer with one JSON body or a stream of events.

mod collect;
mod logprobs;
mod prepare;
mod stream;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrite_engine::{FinishReason, SequenceEvent};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::state::{unix_now, AppState};
use crate::validate::{parse_body, GenerateParams};
use prepare::Prepared;

/// One prompt's submitted sequences and what its choices repeat.
struct SubmittedPrompt {
    /// The prompt's position in the request.
    prompt_index: usize,
    /// The text `echo` prepends.
    echo_text: String,
    /// Its length in tokens.
    prompt_tokens: usize,
    /// Event streams of its sequences (`best_of` of them).
    events: Vec<UnboundedReceiver<SequenceEvent>>,
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
    body: Bytes,
) -> Result<Response, ApiError> {
    let engine = state.engine()?.clone();
    let params = GenerateParams::try_from(parse_body(&body, state.ignore_unknown_fields)?)?;
    state.check_model(&params.model)?;
    if let Some(user) = &params.user {
        tracing::info!(user, "completion request");
    }
    let params = Arc::new(params);
    let prepared = {
        let (params, engine) = (Arc::clone(&params), engine.clone());
        tokio::task::spawn_blocking(move || {
            let constraint = match &params.constraint {
                Some(c) => Some(engine.compile_grammar(&c.grammar).map_err(|e| {
                    ApiError::invalid(c.field, format!("invalid `{}`: {e}", c.field))
                })?),
                None => None,
            };
            prepare::prepare(
                &params,
                engine.tokenizer(),
                engine.context_length(),
                constraint,
            )
        })
        .await
        .map_err(|_| ApiError::Internal)??
    };
    let Prepared {
        prompts,
        appended_suffix,
    } = prepared;
    let mut submitted = Vec::with_capacity(prompts.len());
    for (prompt_index, prompt) in prompts.into_iter().enumerate() {
        submitted.push(SubmittedPrompt {
            prompt_index,
            echo_text: prompt.echo_text,
            prompt_tokens: prompt.prompt_tokens,
            events: engine.submit_group(prompt.requests)?,
        });
    }
    let meta = ResponseMeta {
        id: format!("cmpl-{:032x}", rand::random::<u128>()),
        created: unix_now(),
        model: state.model_name().to_string(),
        fingerprint: state.fingerprint.clone(),
    };
    let tokenizer = Arc::clone(engine.tokenizer());
    if params.stream {
        Ok(stream::respond(meta, params, tokenizer, appended_suffix, submitted).into_response())
    } else {
        let body = collect::respond(meta, &params, &tokenizer, appended_suffix, submitted).await?;
        Ok(Json(body).into_response())
    }
}

/// `finish_reason` and vLLM's `stop_reason` for a finish.
fn finish_fields(reason: &FinishReason) -> (String, Option<Value>) {
    match reason {
        FinishReason::EndOfSequence(_) => ("stop".into(), None),
        FinishReason::StopToken(id) => ("stop".into(), Some(Value::from(*id))),
        FinishReason::GrammarComplete => ("stop".into(), None),
        FinishReason::StopString(s) => ("stop".into(), Some(Value::String(s.clone()))),
        FinishReason::Length => ("length".into(), None),
    }
}
