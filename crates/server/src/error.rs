//! The HTTP layer's error type and its OpenAI-style JSON body.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrite_engine::tokenizer::Cancelled;
use ferrite_engine::EngineError;
use ferrite_protocol::{ErrorBody, ErrorDetail};

/// An error answered to a client, with its HTTP status, OpenAI `type`, `param` and `code`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// Bad JSON, a wrong type, a value out of range, an unknown or conflicting field.
    #[error("{message}")]
    InvalidRequest {
        /// What is wrong.
        message: String,
        /// The offending field.
        param: Option<String>,
    },
    /// The prompt, or the prompt plus `max_tokens`, does not fit the model's context
    /// (OpenAI's code `context_length_exceeded`).
    #[error("{message}")]
    ContextLengthExceeded {
        /// What does not fit, in tokens.
        message: String,
        /// `prompt` or `max_tokens`.
        param: String,
    },
    /// A body whose `Content-Type` is not JSON.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// A protected route without a valid API key.
    #[error("{0}")]
    Unauthorized(String),
    /// A browser's preflight from an origin `--allowed-origins` does not list.
    #[error("cross-origin requests from `{0}` are not allowed (the server's --allowed-origins)")]
    OriginNotAllowed(String),
    /// A `Host` the server does not answer to (`--allowed-hosts`).
    #[error("this server does not answer to the host name `{0}` (its --allowed-hosts)")]
    HostNotAllowed(String),
    /// The request names a model this server does not serve.
    #[error("the model `{0}` does not exist")]
    ModelNotFound(String),
    /// No such route.
    #[error("no route for {0}")]
    RouteNotFound(String),
    /// The request body is larger than the server takes.
    #[error("the request body is larger than this server's limit of {0} bytes")]
    PayloadTooLarge(usize),
    /// The waiting queue is full.
    #[error("the server is overloaded ({0} requests are waiting); retry shortly")]
    Overloaded(usize),
    /// The model is still loading, or the server is shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// The request's `inference_timeout` passed before it finished.
    #[error("the request did not finish within {0} seconds (its inference_timeout, or the server's --request-timeout)")]
    Timeout(f64),
    /// A bug; the message says nothing internal.
    #[error("the server had an internal error while processing the request")]
    Internal,
}

impl ApiError {
    /// A 400 naming the field at fault.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            message: message.into(),
            param: Some(param.into()),
        }
    }

    /// A 400 about the request as a whole.
    pub fn invalid_body(message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            message: message.into(),
            param: None,
        }
    }

    /// The same error naming `to` where it named `from`: a chat request's prompt is its
    /// `messages`, so an error about the prompt names them.
    pub fn with_param_renamed(self, from: &str, to: &str) -> Self {
        match self {
            Self::InvalidRequest {
                message,
                param: Some(param),
            } if param == from => Self::InvalidRequest {
                message: message.replace("the prompt", "the rendered conversation"),
                param: Some(to.to_string()),
            },
            Self::ContextLengthExceeded { message, param } if param == from => {
                Self::ContextLengthExceeded {
                    message: message.replace("the prompt", "the rendered conversation"),
                    param: to.to_string(),
                }
            }
            other => other,
        }
    }

    /// The server shut down before the request finished.
    pub fn shut_down_midway() -> Self {
        Self::Unavailable("the server shut down before the request finished".into())
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest { .. } | Self::ContextLengthExceeded { .. } => {
                StatusCode::BAD_REQUEST
            }
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::OriginNotAllowed(_) | Self::HostNotAllowed(_) => StatusCode::FORBIDDEN,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::ModelNotFound(_) | Self::RouteNotFound(_) => StatusCode::NOT_FOUND,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody {
        let (kind, param, code) = match self {
            Self::InvalidRequest { param, .. } => ("invalid_request_error", param.clone(), None),
            Self::ContextLengthExceeded { param, .. } => (
                "invalid_request_error",
                Some(param.clone()),
                Some("context_length_exceeded"),
            ),
            Self::UnsupportedMediaType(_) => (
                "invalid_request_error",
                None,
                Some("unsupported_media_type"),
            ),
            Self::ModelNotFound(_) => (
                "invalid_request_error",
                Some("model".to_string()),
                Some("model_not_found"),
            ),
            Self::RouteNotFound(_) => ("invalid_request_error", None, None),
            Self::PayloadTooLarge(_) => ("invalid_request_error", None, Some("request_too_large")),
            Self::Overloaded(_) => ("rate_limit_error", None, Some("server_overloaded")),
            Self::Unauthorized(_) => ("authentication_error", None, Some("invalid_api_key")),
            Self::OriginNotAllowed(_) => ("permission_error", None, Some("origin_not_allowed")),
            Self::HostNotAllowed(_) => ("permission_error", None, Some("host_not_allowed")),
            Self::Unavailable(_) => ("server_error", None, Some("service_unavailable")),
            Self::Timeout(_) => (
                "timeout_error",
                Some("inference_timeout".to_string()),
                Some("timeout"),
            ),
            Self::Internal => ("server_error", None, None),
        };
        ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind: kind.to_string(),
                param,
                code: code.map(str::to_string),
            },
        }
    }
}

impl From<Cancelled> for ApiError {
    /// Tokenizing stopped because the client went away: nobody reads this answer.
    fn from(_: Cancelled) -> Self {
        Self::Unavailable("the request was cancelled".into())
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::InvalidRequest { field, message } => Self::InvalidRequest {
                message,
                param: Some(field.into()),
            },
            EngineError::Stopped => Self::Unavailable("the server is shutting down".into()),
            EngineError::Overloaded(waiting) => Self::Overloaded(waiting),
            other => {
                tracing::error!(error = %other, kind = other.kind(), "engine error");
                Self::Internal
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), Json(self.body())).into_response();
        if matches!(self, Self::Unauthorized(_)) {
            response
                .headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
        }
        let retry_after = match self {
            Self::Unavailable(_) => Some("5"),
            Self::Overloaded(_) => Some("1"),
            _ => None,
        };
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from_static(seconds));
        }
        if matches!(self, Self::Timeout(_)) {
            // The request ran out its own deadline: sending it again would only do the
            // same. OpenAI's SDKs otherwise retry a 504 twice more.
            response
                .headers_mut()
                .insert("x-should-retry", HeaderValue::from_static("false"));
        }
        response
    }
}
