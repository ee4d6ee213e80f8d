//! The outermost layer of every route: a request id (the client's `x-request-id`, or a
//! new one) on the request's tracing span and echoed in the response, one log line per
//! answered request, and the request metrics. A streamed answer counts as finished when
//! its body ends, whether it ran to its end or the client went away.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use tracing::Instrument;

use crate::state::AppState;

/// The header that carries a request id.
pub const REQUEST_ID: &str = "x-request-id";

/// Tags, logs and measures one request.
pub async fn observe(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| is_usable_id(v))
        .map_or_else(new_request_id, str::to_string);
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let span = tracing::info_span!("request", id = %id);
    let started = Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    if matches!(path.as_str(), "/health" | "/ready" | "/metrics") {
        return response;
    }
    let status = response.status().as_u16();
    state.metrics.count_request(status);
    let finished = Finished {
        state,
        span,
        started,
        method: method.to_string(),
        is_completion: path == "/v1/completions",
        path,
        status,
    };
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(Observed {
            body,
            _finished: finished,
        }),
    )
}

/// An answer's body carrying its [`Finished`] guard, which it drops with itself: at the
/// body's end, or when the client goes away.
struct Observed {
    body: Body,
    /// Held only to be dropped with the body.
    _finished: Finished,
}

impl HttpBody for Observed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Logs and measures a request when its answer's body is dropped.
struct Finished {
    state: Arc<AppState>,
    span: tracing::Span,
    started: Instant,
    method: String,
    path: String,
    is_completion: bool,
    status: u16,
}

impl Drop for Finished {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        if self.is_completion {
            self.state.metrics.request_duration.observe(elapsed);
        }
        self.span.in_scope(|| {
            tracing::info!(
                method = %self.method,
                path = %self.path,
                status = self.status,
                ms = elapsed.as_secs_f64() * 1e3,
                "request finished"
            );
        });
    }
}

/// Ids a client sends are kept when they are short printable ASCII.
fn is_usable_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic())
}

/// A fresh random id.
fn new_request_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_kept_only_when_short_and_printable() {
        assert!(is_usable_id("abc-123_XYZ"));
        assert!(!is_usable_id(""));
        assert!(!is_usable_id("has space"));
        assert!(!is_usable_id(&"x".repeat(129)));
        assert_eq!(new_request_id().len(), 32);
        assert_ne!(new_request_id(), new_request_id());
    }
}
