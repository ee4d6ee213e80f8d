//! The outermost layer of every route: a request id (the client's `x-request-id`, or a
//! new one) on the request's tracing span and echoed in the response, one log line per
//! request, and the request metrics. A request counts when its answer's body is done:
//! under its HTTP status when the body ran to its end, under `disconnected` (and with a
//! log line that says so) when the client went away first: before the answer (the
//! handler is dropped) or in the middle of a stream (the body is dropped). From its
//! arrival to then it counts as in flight.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
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
    let observed = !matches!(path.as_str(), "/health" | "/ready" | "/metrics");
    if observed {
        state.metrics.enter();
    }
    // Dropped with this future if the client leaves before the handler answers.
    let mut finished = Finished {
        state,
        span: span.clone(),
        started,
        method: method.to_string(),
        is_generation: matches!(path.as_str(), "/v1/completions" | "/v1/chat/completions"),
        path,
        status: None,
        ended: Arc::new(AtomicBool::new(false)),
        observed,
    };
    let mut response = next.run(request).instrument(span).await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    if !observed {
        return response;
    }
    let status = response.status();
    finished.status = Some(status.as_u16());
    let (parts, body) = response.into_parts();
    // An answer with no body to send is complete as it stands: the body of a HEAD answer
    // is dropped unread (by the router, outside this layer), as is that of a 1xx, 204 or
    // 304.
    let bodiless = method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    finished
        .ended
        .store(bodiless || body.is_end_stream(), Ordering::Relaxed);
    let ended = Arc::clone(&finished.ended);
    Response::from_parts(
        parts,
        Body::new(Observed {
            body,
            ended,
            _finished: finished,
        }),
    )
}

/// An answer's body carrying its [`Finished`] guard, which it drops with itself: at the
/// body's end, or when the client goes away.
struct Observed {
    body: Body,
    /// Set once the body has given its last frame.
    ended: Arc<AtomicBool>,
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
        let poll = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(poll, Poll::Ready(None)) || self.body.is_end_stream() {
            self.ended.store(true, Ordering::Relaxed);
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Logs and measures a request when its answer's body is dropped, or when the request
/// itself is (its client left before the answer).
struct Finished {
    state: Arc<AppState>,
    span: tracing::Span,
    started: Instant,
    method: String,
    path: String,
    /// A completion or chat request, whose duration is measured.
    is_generation: bool,
    /// The answer's status, once there is an answer.
    status: Option<u16>,
    /// Whether the answer's body was sent to its end.
    ended: Arc<AtomicBool>,
    /// `false` for the probes (`/health`, `/ready`, `/metrics`): neither logged nor counted.
    observed: bool,
}

impl Drop for Finished {
    fn drop(&mut self) {
        if !self.observed {
            return;
        }
        self.state.metrics.leave();
        let elapsed = self.started.elapsed();
        let ms = elapsed.as_secs_f64() * 1e3;
        let complete = self.ended.load(Ordering::Relaxed);
        match self.status {
            Some(status) if complete => self.state.metrics.count_request(status),
            _ => self.state.metrics.count_disconnected(),
        }
        if self.is_generation {
            self.state.metrics.request_duration.observe(elapsed);
        }
        let message = match (self.status, complete) {
            (Some(_), true) => "request finished",
            (Some(_), false) => "client disconnected before the end of the answer",
            (None, _) => "client disconnected before the answer",
        };
        self.span.in_scope(|| {
            tracing::info!(
                method = %self.method,
                path = %self.path,
                status = self.status,
                ms,
                "{message}"
            )
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
