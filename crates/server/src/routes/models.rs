//! `GET /v1/models` and `GET /v1/models/{id}`. Like every model route they answer 503
//! with `Retry-After` until the model is loaded (and once shutting down): a script that
//! waits for `/v1/models` to answer can then send completions.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use ferrite_protocol::{ModelCard, ModelList};

use crate::error::ApiError;
use crate::state::AppState;

fn card(state: &AppState, name: &str, context_length: usize) -> ModelCard {
    ModelCard {
        id: name.to_string(),
        object: "model".into(),
        created: state.created,
        owned_by: "ferrite".into(),
        max_model_len: context_length,
    }
}

/// Lists the served model under each of its names.
pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<ModelList>, ApiError> {
    let context = state.engine()?.context_length();
    let data = state
        .names
        .iter()
        .map(|name| card(&state, name, context))
        .collect();
    Ok(Json(ModelList {
        object: "list".into(),
        data,
    }))
}

/// One model by any name a request may use for it; 404 `model_not_found` otherwise.
pub async fn retrieve(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    let context = state.engine()?.context_length();
    state.check_model(&id)?;
    Ok(Json(card(&state, &id, context)))
}
