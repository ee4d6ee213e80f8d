//! `GET /v1/models`.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use ferrite_protocol::{ModelCard, ModelList};

use crate::state::AppState;

/// Lists the served model under each of its names.
pub async fn list(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    let max_model_len = state.engine.get().map_or(0, |e| e.context_length());
    let data = state
        .names
        .iter()
        .map(|name| ModelCard {
            id: name.clone(),
            object: "model".into(),
            created: state.created,
            owned_by: "ferrite".into(),
            max_model_len,
        })
        .collect();
    Json(ModelList {
        object: "list".into(),
        data,
    })
}
