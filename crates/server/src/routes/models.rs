//! `GET /v1/models` and `GET /v1/models/{id}`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use ferrite_protocol::{ModelCard, ModelList};

use crate::error::ApiError;
use crate::state::AppState;

fn card(state: &AppState, name: &str) -> ModelCard {
    ModelCard {
        id: name.to_string(),
        object: "model".into(),
        created: state.created,
        owned_by: "ferrite".into(),
        max_model_len: state.engine.get().map_or(0, |e| e.context_length()),
    }
}

/// Lists the served model under each of its names.
pub async fn list(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    let data = state.names.iter().map(|name| card(&state, name)).collect();
    Json(ModelList {
        object: "list".into(),
        data,
    })
}

/// One model by any name a request may use for it; 404 `model_not_found` otherwise.
pub async fn retrieve(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    state.check_model(&id)?;
    Ok(Json(card(&state, &id)))
}
