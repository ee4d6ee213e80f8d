//! The HTTP layer's error type and its OpenAI-style JSON body.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
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
    /// A protected route without a valid API key.
    #[error("{0}")]
    Unauthorized(String),
    /// The request names a model this server does not serve.
    #[error("the model `{0}` does not exist")]
    ModelNotFound(String),
    /// No such route.
    #[error("no route for {0}")]
    RouteNotFound(String),
    /// The model is still loading, or the server is shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// The request's `inference_timeout` passed before it finished.
    #[error("the request did not finish within its inference_timeout of {0} seconds")]
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

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
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
            Self::ModelNotFound(_) => (
                "invalid_request_error",
                Some("model".to_string()),
                Some("model_not_found"),
            ),
            Self::RouteNotFound(_) => ("invalid_request_error", None, None),
            Self::Unauthorized(_) => ("authentication_error", None, Some("invalid_api_key")),
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

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::InvalidRequest(message) => Self::InvalidRequest {
                message,
                param: Some("prompt".into()),
            },
            EngineError::Stopped => Self::Unavailable("the server is shutting down".into()),
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
        if matches!(self, Self::Unavailable(_)) {
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from_static("5"));
        }
        response
    }
}
