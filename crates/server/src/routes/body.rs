//! The raw body of a POST route, with body errors in the OpenAI shape: a body whose
//! `Content-Type` is not JSON, or missing, is a 415, one over `--max-body-size` a 413, one
//! that cannot be read a 400. A JSON type cannot be sent across origins without a CORS
//! preflight, so a web page elsewhere cannot post to a server that has no key (a form, or
//! a `fetch` with no or a plain content type, needs none).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::HeaderMap;
use axum::http::StatusCode;

use crate::error::ApiError;
use crate::state::AppState;

/// A request body, read whole (up to the server's limit, which the router's
/// `DefaultBodyLimit` enforces).
pub struct RawBody(pub Bytes);

impl FromRequest<Arc<AppState>> for RawBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        check_json_content_type(request.headers())?;
        let limits = &state.limits;
        // A declared length over the limit is refused before any byte is awaited.
        let declared = request
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|len| len > limits.max_body_bytes as u64) {
            return Err(ApiError::PayloadTooLarge(limits.max_body_bytes));
        }
        let read = tokio::time::timeout(
            limits.body_read_timeout,
            Bytes::from_request(request, state),
        );
        let Ok(read) = read.await else {
            return Err(ApiError::invalid_body(format!(
                "the request body did not arrive within {} s",
                limits.body_read_timeout.as_secs_f64()
            )));
        };
        match read {
            Ok(bytes) => Ok(Self(bytes)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::PayloadTooLarge(state.limits.max_body_bytes))
            }
            Err(rejection) => {
                let status = rejection.status();
                let text = rejection.body_text();
                tracing::debug!(%status, text, "cannot read a request body");
                Err(ApiError::invalid_body(format!(
                    "cannot read the request body: {text}"
                )))
            }
        }
    }
}

/// A 415 unless the body says it is JSON (`application/json` or any `application/…+json`
/// type): a form, plain text or no type at all is what a page on another origin can send
/// without a preflight.
fn check_json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return Err(ApiError::UnsupportedMediaType(
            "the request has no Content-Type; this route takes JSON: send `Content-Type: application/json`".into(),
        ));
    };
    let media = value
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let json = media == "application/json"
        || media
            .strip_prefix("application/")
            .is_some_and(|t| t.ends_with("+json"));
    if json {
        return Ok(());
    }
    let shown: String = media.chars().take(100).collect();
    Err(ApiError::UnsupportedMediaType(format!(
        "the body's Content-Type is `{shown}`; this route takes JSON: send `Content-Type: application/json`"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::extract::DefaultBodyLimit;
    use axum::routing::post;
    use axum::Router;
    use tower::ServiceExt;

    async fn echo_len(RawBody(body): RawBody) -> String {
        body.len().to_string()
    }

    #[test]
    fn only_json_content_types_are_read() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, value.parse().unwrap());
            check_json_content_type(&headers)
        };
        assert!(check_json_content_type(&HeaderMap::new()).is_err());
        for ok in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/vnd.api+json",
        ] {
            assert!(with(ok).is_ok(), "{ok}");
        }
        for bad in [
            "application/x-www-form-urlencoded",
            "text/plain",
            "multipart/form-data; boundary=x",
            "",
            "application/jsonp",
        ] {
            let err = with(bad).unwrap_err();
            assert_eq!(err.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "{bad}");
            assert_eq!(
                err.body().error.code.as_deref(),
                Some("unsupported_media_type")
            );
        }
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_a_413_in_the_openai_shape() {
        let mut state = AppState::new(vec!["m".into()], false);
        state.limits.max_body_bytes = 10;
        let app = Router::new()
            .route("/", post(echo_len))
            .layer(DefaultBodyLimit::max(10))
            .with_state(Arc::new(state));
        let small = Request::post("/")
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from("0123456789"))
            .unwrap();
        let response = app.clone().oneshot(small).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let large = Request::post("/")
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from("01234567890"))
            .unwrap();
        let response = app.oneshot(large).await.unwrap();
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("10 bytes"));
    }
}
