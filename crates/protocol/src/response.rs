//! What the server sends back: completions, stream chunks, model lists, errors.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (each prompt counted once).
    pub prompt_tokens: usize,
    /// Generated tokens over all choices.
    pub completion_tokens: usize,
    /// The sum of both.
    pub total_tokens: usize,
}

/// One choice of a non-streaming completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// `prompt_index * n + choice_index`.
    pub index: usize,
    /// Generated text.
    pub text: String,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<Value>,
    /// `stop` or `length`.
    pub finish_reason: Option<String>,
    /// The stop string or token id that ended the choice (vLLM).
    pub stop_reason: Option<Value>,
}

/// A non-streaming completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    /// `cmpl-…`.
    pub id: String,
    /// Always `text_completion`.
    pub object: String,
    /// Unix time of creation.
    pub created: u64,
    /// The model that answered.
    pub model: String,
    /// Identifies the server build.
    pub system_fingerprint: String,
    /// The choices, ordered by index.
    pub choices: Vec<Choice>,
    /// Token counts.
    pub usage: Usage,
}

/// One choice inside a stream chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    /// Choice index.
    pub index: usize,
    /// New text.
    pub text: String,
    /// Log-probabilities of the new tokens, when asked for.
    pub logprobs: Option<Value>,
    /// Set on the choice's last chunk.
    pub finish_reason: Option<String>,
    /// The stop string or token id, on the last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Value>,
}

/// One server-sent event of a streaming completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChunk {
    /// Same id on every chunk of a response.
    pub id: String,
    /// Always `text_completion`.
    pub object: String,
    /// Unix time of creation.
    pub created: u64,
    /// The model.
    pub model: String,
    /// Identifies the server build.
    pub system_fingerprint: String,
    /// Choices with new text (empty on the usage chunk).
    pub choices: Vec<ChunkChoice>,
    /// Present on the last chunk when `stream_options.include_usage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A model in `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    /// Name to put in requests.
    pub id: String,
    /// Always `model`.
    pub object: String,
    /// Unix time the model was loaded.
    pub created: u64,
    /// Always `ferrite`.
    pub owned_by: String,
    /// Longest prompt plus completion, in tokens.
    pub max_model_len: usize,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    /// The served models.
    pub data: Vec<ModelCard>,
}

/// The inside of an error body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI error type (`invalid_request_error`, …).
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// A machine-readable code, if any.
    pub code: Option<String>,
}

/// `{"error": {...}}`, the body of every error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The answer of `POST /tokenize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizeResponse {
    /// Number of tokens.
    pub count: usize,
    /// The context length.
    pub max_model_len: usize,
    /// The token ids.
    pub tokens: Vec<u32>,
    /// Each token's text, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_strs: Option<Vec<String>>,
}

/// The answer of `POST /detokenize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    /// The text.
    pub prompt: String,
}
