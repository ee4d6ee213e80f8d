//! `POST /tokenize` and `POST /detokenize`, in vLLM's shapes.

use std::sync::Arc;

use crate::routes::body::RawBody;
use crate::routes::cancel::CancelOnDrop;
use axum::extract::State;
use axum::Json;
use ferrite_protocol::{DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;
use crate::validate::deserialize_naming_the_field;

/// Parses a JSON body, naming the field at fault.
fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid_body(format!("the body is not valid JSON: {e}")))?;
    deserialize_naming_the_field(value)
}

/// Tokenizes text as a prompt would be (or without special tokens).
pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let engine = state.engine()?.clone();
    let request: TokenizeRequest = parse(&body)?;
    if let Some(model) = &request.model {
        state.check_model(model)?;
    }
    let tokenizer = Arc::clone(engine.tokenizer());
    let special = request.add_special_tokens.unwrap_or(true);
    let with_strs = request.return_token_strs.unwrap_or(false);
    // A client that leaves stops the tokenization of a long prompt.
    let (_guard, cancelled) = CancelOnDrop::new();
    let (tokens, strs) = tokio::task::spawn_blocking(move || {
        let tokens = if special {
            tokenizer
                .encode_prompt_until(&request.prompt, &cancelled)
                .map_err(|_| ApiError::Unavailable("the request was cancelled".into()))?
        } else {
            tokenizer.encode(&request.prompt, false)
        };
        let strs = with_strs.then(|| {
            tokens
                .iter()
                .map(|&t| String::from_utf8_lossy(&tokenizer.token_bytes(t, true)).into_owned())
                .collect()
        });
        Ok::<_, ApiError>((tokens, strs))
    })
    .await
    .map_err(|_| ApiError::Internal)??;
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: engine.context_length(),
        tokens,
        token_strs: strs,
    }))
}

/// Turns token ids back into text (special tokens included).
pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let engine = state.engine()?.clone();
    let request: DetokenizeRequest = parse(&body)?;
    if let Some(model) = &request.model {
        state.check_model(model)?;
    }
    let vocab = engine.tokenizer().vocab_size();
    let ids = request
        .tokens
        .iter()
        .map(|&t| match u32::try_from(t) {
            Ok(id) if (id as usize) < vocab => Ok(id),
            _ => Err(ApiError::invalid(
                "tokens",
                format!("token id {t} is out of the vocabulary (0..{vocab})"),
            )),
        })
        .collect::<Result<Vec<u32>, _>>()?;
    Ok(Json(DetokenizeResponse {
        prompt: engine.tokenizer().decode(&ids, true),
    }))
}
