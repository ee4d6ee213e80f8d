//! Liveness, readiness and Prometheus metrics.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use crate::error::ApiError;
use crate::state::AppState;

/// `GET /health`: 200 while the process serves.
pub async fn health() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// `GET /ready`: 200 once the model is loaded and warmed up, 503 before and once the
/// server is shutting down.
pub async fn ready(State(state): State<Arc<AppState>>) -> Result<impl IntoResponse, ApiError> {
    state.engine()?;
    Ok((
        StatusCode::OK,
        Json(json!({"status": "ready", "model": state.model_name()})),
    ))
}

/// `GET /metrics`: the server's and the engine's metrics in Prometheus text format.
pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let engine = state.engine.get().map(|e| e.stats());
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(engine),
    )
}
