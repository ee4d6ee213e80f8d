//! Liveness, readiness and Prometheus metrics.

use std::fmt::Write;
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

/// `GET /ready`: 200 once the model is loaded and warmed up, 503 before.
pub async fn ready(State(state): State<Arc<AppState>>) -> Result<impl IntoResponse, ApiError> {
    state.engine()?;
    Ok((
        StatusCode::OK,
        Json(json!({"status": "ready", "model": state.model_name()})),
    ))
}

/// `GET /metrics`: the engine's counters in Prometheus text format.
pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let mut out = String::new();
    let ready = state.engine.get().is_some();
    let mut gauge = |name: &str, help: &str, kind: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    gauge(
        "ferrite_ready",
        "1 once the model is loaded and warmed up.",
        "gauge",
        u64::from(ready),
    );
    if let Some(engine) = state.engine.get() {
        let s = engine.stats();
        gauge(
            "ferrite_running_sequences",
            "Sequences in the running batch.",
            "gauge",
            s.running as u64,
        );
        gauge(
            "ferrite_waiting_sequences",
            "Sequences waiting for admission.",
            "gauge",
            s.waiting as u64,
        );
        gauge(
            "ferrite_forward_steps_total",
            "Batched forward steps run.",
            "counter",
            s.steps,
        );
        gauge(
            "ferrite_prompt_tokens_total",
            "Prompt tokens run through the model.",
            "counter",
            s.prompt_tokens,
        );
        gauge(
            "ferrite_generated_tokens_total",
            "Tokens generated.",
            "counter",
            s.generated_tokens,
        );
        gauge(
            "ferrite_sequences_finished_total",
            "Sequences that finished.",
            "counter",
            s.finished,
        );
        gauge(
            "ferrite_sequences_abandoned_total",
            "Sequences dropped because their client went away.",
            "counter",
            s.abandoned,
        );
        gauge(
            "ferrite_sequences_timed_out_total",
            "Sequences ended by their inference_timeout.",
            "counter",
            s.timed_out,
        );
        gauge(
            "ferrite_prefix_cache_hit_tokens_total",
            "Prompt tokens whose keys and values came from the prefix cache.",
            "counter",
            s.prefix_cache_hit_tokens,
        );
        gauge(
            "ferrite_draft_tokens_accepted_total",
            "Predicted tokens accepted as drafts, generated without a forward step of their own.",
            "counter",
            s.draft_tokens_accepted,
        );
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}
