//! The HTTP routes.

mod completions;
mod health;
mod models;
mod tokenize;

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;

use crate::error::ApiError;
use crate::state::AppState;

/// The router with every route of the API.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*id}", get(models::retrieve))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/metrics", get(health::metrics))
        .fallback(not_found)
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::RouteNotFound(uri.path().to_string())
}
