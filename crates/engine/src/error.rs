//! The engine's error type.

use thiserror::Error;

/// Everything that can go wrong inside the engine, each variant with a stable kind.
#[derive(Debug, Error)]
pub enum EngineError {
    /// Reading a model file failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The model file is malformed or lacks something the architecture needs.
    #[error("invalid model: {0}")]
    InvalidModel(String),
    /// The model uses something this engine does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A tensor operation failed.
    #[error("tensor error: {0}")]
    Tensor(#[from] candle_core::Error),
    /// A request the engine cannot run (bad token ids, too long a prompt, …): the request
    /// field at fault (the API's name for it) and why.
    #[error("{message}")]
    InvalidRequest {
        /// The field, as the OpenAI-style APIs name it (`prompt`, `logit_bias`, …).
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The engine is shutting down or its thread has stopped.
    #[error("the engine is not running")]
    Stopped,
    /// The waiting queue is full; retry later.
    #[error("the server is overloaded: {0} requests are already waiting")]
    Overloaded(usize),
}

impl EngineError {
    /// An [`EngineError::InvalidRequest`] naming `field`.
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            field,
            message: message.into(),
        }
    }

    /// A short stable name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Io(_) => "io",
            Self::InvalidModel(_) => "invalid_model",
            Self::Unsupported(_) => "unsupported",
            Self::Tensor(_) => "tensor",
            Self::InvalidRequest { .. } => "invalid_request",
            Self::Stopped => "stopped",
            Self::Overloaded(_) => "overloaded",
        }
    }
}
