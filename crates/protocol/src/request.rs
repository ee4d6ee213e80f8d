//! The body of `POST /v1/completions`, as clients send it.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// Every request field of `POST /v1/completions` that any of the supported vendors
/// documents (see `docs/API.md`). A field outside this list is an unknown field.
pub const KNOWN_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "suffix",
    "max_tokens",
    "max_completion_tokens",
    "max_new_tokens",
    "context_length_exceeded_behavior",
    "truncate_sequence",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "seed",
    "n",
    "best_of",
    "stop",
    "stop_sequences",
    "include_stop_str_in_output",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "echo",
    "logprobs",
    "top_logprobs",
    "return_token_log_probs",
    "return_tokens_as_token_ids",
    "prompt_logprobs",
    "allowed_token_ids",
    "return_token_ids",
    "skip_special_tokens",
    "mirostat_target",
    "mirostat_lr",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_sequence_breakers",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "grammar",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "images",
    "stream",
    "stream_options",
    "inference_timeout",
    "prediction",
    "modalities",
    "audio",
    "user",
    "inference_extra_params",
    "inference_extra_headers",
    "metadata",
    "priority",
];

/// The prompt in any of its four shapes. Read straight from the body, element by element
/// (`prompt.rs`): an untagged enum would first copy the whole value into
/// a tree of 32-byte nodes, and a body of four million token ids into 128 MiB.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// One text prompt.
    Text(String),
    /// Several text prompts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<i64>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<i64>>),
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// A single stop string.
    One(String),
    /// Several stop strings.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// `logprobs`: a count of alternatives (legacy) or a switch (with `top_logprobs`).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Logprobs {
    /// `true` / `false`.
    Switch(bool),
    /// How many alternatives per token, 0..=20.
    Count(i64),
}

/// One part of a predicted output given as a list.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictionPart {
    /// Always `text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    pub text: String,
}

/// The content of a prediction: text, or a list of text parts.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum PredictionContent {
    /// Plain text.
    Text(String),
    /// Text parts, concatenated.
    Parts(Vec<PredictionPart>),
}

/// `prediction`: the expected output.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prediction {
    /// Always `content`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The predicted text.
    pub content: PredictionContent,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` and no choices.
    pub include_usage: Option<bool>,
    /// Put `usage` on every chunk.
    pub continuous_usage_stats: Option<bool>,
}

/// A completion request as received. Fields whose meaning the server implements are
/// typed; the rest of the known fields are kept as raw JSON in `other`, for the server
/// to accept when they ask for nothing and refuse otherwise.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CompletionRequest {
    /// Model name.
    pub model: String,
    /// The prompt(s).
    pub prompt: Prompt,
    /// Text after the completion (fill-in-the-middle).
    pub suffix: Option<String>,
    /// Most tokens to generate per choice.
    pub max_tokens: Option<i64>,
    /// Alias of `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    /// Alias of `max_tokens`.
    pub max_new_tokens: Option<i64>,
    /// `truncate` or `error` when prompt plus completion exceed the context.
    pub context_length_exceeded_behavior: Option<String>,
    /// Keep the end of a prompt that alone exceeds the context.
    pub truncate_sequence: Option<bool>,
    /// Sampling temperature; 0 is greedy.
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    pub top_p: Option<f64>,
    /// Keep the k most likely tokens; 0 or -1 is off.
    pub top_k: Option<i64>,
    /// Drop tokens below `min_p` times the top probability.
    pub min_p: Option<f64>,
    /// Locally typical sampling mass.
    pub typical_p: Option<f64>,
    /// OpenAI frequency penalty.
    pub frequency_penalty: Option<f64>,
    /// OpenAI presence penalty.
    pub presence_penalty: Option<f64>,
    /// CTRL repetition penalty.
    pub repetition_penalty: Option<f64>,
    /// Token id (as a string) → bias added to its logit.
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Mirostat 2.0 target surprise (turns it on).
    pub mirostat_target: Option<f64>,
    /// Mirostat 2.0 learning rate.
    pub mirostat_lr: Option<f64>,
    /// DRY penalty scale (0 is off).
    pub dry_multiplier: Option<f64>,
    /// DRY penalty growth.
    pub dry_base: Option<f64>,
    /// Longest repeat DRY lets pass.
    pub dry_allowed_length: Option<i64>,
    /// Strings that end a DRY repeat.
    pub dry_sequence_breakers: Option<Vec<String>>,
    /// Seed for reproducible sampling.
    pub seed: Option<i64>,
    /// Choices per prompt.
    pub n: Option<i64>,
    /// Candidates generated per prompt, of which the `n` best are returned.
    pub best_of: Option<i64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Alias of `stop`.
    pub stop_sequences: Option<Stop>,
    /// Keep the matched stop string in the text.
    pub include_stop_str_in_output: Option<bool>,
    /// Extra token ids that end generation.
    pub stop_token_ids: Option<Vec<i64>>,
    /// Keep generating past end-of-sequence tokens.
    pub ignore_eos: Option<bool>,
    /// Tokens to generate before an end can come.
    pub min_tokens: Option<i64>,
    /// Prepend the prompt to the text.
    pub echo: Option<bool>,
    /// Log-probabilities: a count of alternatives, or a switch.
    pub logprobs: Option<Logprobs>,
    /// Alternatives per token with `logprobs: true`.
    pub top_logprobs: Option<i64>,
    /// Same as `logprobs: 0`.
    pub return_token_log_probs: Option<bool>,
    /// Write tokens in logprobs as `token_id:<id>`.
    pub return_tokens_as_token_ids: Option<bool>,
    /// vLLM: log-probabilities of the prompt's tokens, with this many alternatives.
    pub prompt_logprobs: Option<i64>,
    /// vLLM: only these token ids may be generated.
    pub allowed_token_ids: Option<Vec<i64>>,
    /// vLLM: the choice carries `prompt_token_ids` and `token_ids`.
    pub return_token_ids: Option<bool>,
    /// Leave special tokens out of the text.
    pub skip_special_tokens: Option<bool>,
    /// Stream the answer as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Wall-clock limit in seconds.
    pub inference_timeout: Option<f64>,
    /// Expected output, verified as draft tokens.
    pub prediction: Option<Prediction>,
    /// Input images (data URIs).
    pub images: Option<Vec<String>>,
    /// Output modalities; only `text` is served.
    pub modalities: Option<Vec<String>>,
    /// Audio output settings; not served.
    pub audio: Option<Value>,
    /// Output format: text, a JSON object (with a schema), a JSON schema, or a grammar.
    pub response_format: Option<Value>,
    /// A JSON schema (object or JSON text) the output must follow.
    pub guided_json: Option<Value>,
    /// A regular expression the output must match.
    pub guided_regex: Option<String>,
    /// The output is exactly one of these.
    pub guided_choice: Option<Vec<String>>,
    /// A grammar in llguidance's Lark dialect.
    pub guided_grammar: Option<String>,
    /// `{"type": "regex" | "json_schema" | "lark" | "llguidance", "value": …}`.
    pub grammar: Option<Value>,
    /// Functions the model may call.
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required`, or a named function.
    pub tool_choice: Option<Value>,
    /// Whether several calls may come at once (accepted; one call is generated).
    pub parallel_tool_calls: Option<bool>,
    /// End user id, logged.
    pub user: Option<String>,
    /// Every other known field, unparsed.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `POST /tokenize` (vLLM's shape).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// Model name (optional; checked when given).
    pub model: Option<String>,
    /// Text to tokenize (this or `messages`).
    pub prompt: Option<String>,
    /// A conversation to tokenize as the chat route's prompt (this or `prompt`).
    pub messages: Option<Vec<Value>>,
    /// With `messages`: end with the start of the assistant's turn (default true).
    pub add_generation_prompt: Option<bool>,
    /// With `messages`: leave the last (assistant) message open, to be continued.
    pub continue_final_message: Option<bool>,
    /// With `messages`: more variables for the chat template.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// With `messages`: the tools, as the chat route renders them.
    pub tools: Option<Vec<Value>>,
    /// Add the model's BOS, as for a prompt (default true). Special tokens written in the
    /// text become their ids either way. With `messages` the chat route's prompt is
    /// given, whose BOS follows the template.
    pub add_special_tokens: Option<bool>,
    /// Also return each token's text.
    pub return_token_strs: Option<bool>,
}

/// `POST /detokenize` (vLLM's shape).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// Model name (optional; checked when given).
    pub model: Option<String>,
    /// Token ids (read as `u32`: a negative or too large id is a type error naming
    /// `tokens`, and four million ids take 16 MB, not 32).
    pub tokens: Vec<u32>,
}
