//! The HTTP routes.

pub(crate) mod body;
mod cancel;
mod completions;
mod health;
mod models;
mod openapi;
mod tokenize;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use axum::Router;

use crate::error::ApiError;
use crate::state::AppState;

/// The router with every route of the API; all but `/health`, `/ready` and `/metrics`
/// need an API key when the server has any. `/metrics` is left out when it has a port
/// of its own ([`metrics_router`]).
pub fn router(state: Arc<AppState>, with_metrics: bool) -> Router {
    let protected = Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*id}", get(models::retrieve))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/tokenizer_info", get(tokenize::tokenizer_info))
        .route("/openapi.json", get(openapi::openapi))
        .route("/docs/API.md", get(openapi::api_reference))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            crate::auth::require_key,
        ));
    let mut router = Router::new()
        .merge(protected)
        .route("/health", get(health::health))
        .route("/ready", get(health::ready));
    if with_metrics {
        router = router.route("/metrics", get(health::metrics));
    }
    router
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(state.limits.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            crate::cors::cors,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            crate::observe::observe,
        ))
        .with_state(state)
}

/// `/metrics` alone, for `--metrics-port`.
pub fn metrics_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(health::metrics))
        .fallback(not_found)
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::RouteNotFound(uri.path().to_string())
}
