//! The HTTP routes.

pub(crate) mod body;
mod cancel;
mod generate;
mod health;
mod models;
mod openapi;
mod tokenize;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::HOST;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Router;

use crate::error::ApiError;
use crate::state::AppState;

/// The routes that need an API key when the server has any: path (axum's syntax), the
/// method and its handler. The router is built from this table and the OpenAPI document's
/// test compares its paths with it, so neither can leave a route out.
fn protected_routes() -> Vec<(&'static str, MethodRouter<Arc<AppState>>)> {
    vec![
        ("/v1/completions", post(generate::completions)),
        (
            "/v1/chat/completions",
            post(generate::chat::chat_completions),
        ),
        ("/v1/models", get(models::list)),
        ("/v1/models/{*id}", get(models::retrieve)),
        ("/tokenize", post(tokenize::tokenize)),
        ("/detokenize", post(tokenize::detokenize)),
        ("/tokenizer_info", get(tokenize::tokenizer_info)),
        ("/openapi.json", get(openapi::openapi)),
        ("/docs/API.md", get(openapi::api_reference)),
    ]
}

/// The probes, open whatever keys the server has (`/metrics` only without a port of its
/// own).
fn open_routes(with_metrics: bool) -> Vec<(&'static str, MethodRouter<Arc<AppState>>)> {
    let mut routes = vec![
        ("/health", get(health::health)),
        ("/ready", get(health::ready)),
    ];
    if with_metrics {
        routes.push(("/metrics", get(health::metrics)));
    }
    routes
}

/// The router with every route of the API; all but `/health`, `/ready` and `/metrics`
/// need an API key when the server has any. `/metrics` is left out when it has a port
/// of its own ([`metrics_router`]).
pub fn router(state: Arc<AppState>, with_metrics: bool) -> Router {
    let protected = protected_routes()
        .into_iter()
        .fold(Router::new(), |r, (path, route)| r.route(path, route))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_key,
        ));
    let router = open_routes(with_metrics)
        .into_iter()
        .fold(Router::new().merge(protected), |r, (path, route)| {
            r.route(path, route)
        });
    router
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(state.limits.max_body_bytes))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), cors))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            check_host,
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

/// Refuses requests whose `Host` (or HTTP/2 `:authority`) the server does not answer to
/// (`--allowed-hosts`, [`crate::hosts`]), with a 403 in the OpenAI shape.
/// Middleware for the protected routes: 401 unless the request presents a key.
async fn require_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match state.api_keys.check(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// Middleware answering preflights and marking answers to allowed origins
/// ([`crate::cors`]); outside the key check: a preflight carries no key.
async fn cors(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    crate::cors::apply(&state.allowed_origins, request, next).await
}

async fn check_host(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let authority = request
        .headers()
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    match authority {
        Some(a) if !state.allowed_hosts.allows(&a) => {
            let shown: String = a.chars().take(200).collect();
            ApiError::HostNotAllowed(shown).into_response()
        }
        _ => next.run(request).await,
    }
}

/// Every path the API router serves, in OpenAPI's syntax (`{*id}` written `{id}`).
#[cfg(test)]
pub(crate) fn served_paths() -> Vec<String> {
    protected_routes()
        .into_iter()
        .chain(open_routes(true))
        .map(|(path, _)| path.replace("{*", "{"))
        .collect()
}
