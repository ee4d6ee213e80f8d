//! What the server sends back: completions, stream chunks, model lists, errors.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

/// JSON written already: a large part of an answer (`prompt_logprobs`), written as it is
/// built rather than held as a tree of values (hundreds of bytes each) until the answer
/// is sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RawJson(pub Box<RawValue>);

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (each prompt counted once).
    pub prompt_tokens: usize,
    /// Generated tokens over all choices.
    pub completion_tokens: usize,
    /// The sum of both.
    pub total_tokens: usize,
    /// How many prompt tokens the prefix cache served; on every usage but the running
    /// usage of `continuous_usage_stats` chunks (known only once the prompts finish).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// OpenAI's breakdown of the prompt tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose keys and values came from the prefix cache instead of being
    /// computed again.
    pub cached_tokens: usize,
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
    /// vLLM's `prompt_logprobs`: per prompt token, `null` for the first, then a map from
    /// token id to `{"logprob", "rank", "decoded_token"}` (the prompt's token and the
    /// most likely ones); `null` when not asked for, as vLLM sends it.
    pub prompt_logprobs: Option<RawJson>,
    /// With `return_token_ids`: the prompt's token ids; `null` otherwise, as vLLM sends it.
    pub prompt_token_ids: Option<Vec<u32>>,
    /// With `return_token_ids`: the generated token ids; `null` otherwise, as vLLM sends it.
    pub token_ids: Option<Vec<u32>>,
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
    /// With `return_token_ids`: the prompt's token ids, on the choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// With `return_token_ids`: the ids of the tokens this chunk's text came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
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
    /// Each token's raw vocabulary string (`Ġis`, `▁is`, `<0x0A>`) with
    /// `return_token_strs: true`; `null` otherwise, as vLLM sends it.
    pub token_strs: Option<Vec<String>>,
}

/// The answer of `POST /detokenize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    /// The text.
    pub prompt: String,
}
