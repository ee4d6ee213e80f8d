//! `POST /v1/chat/completions`: the fields it adds to a completion request, and what it
//! sends back.
//!
//! A chat request is a completion request whose prompt is a conversation: every field of
//! [`crate::CompletionRequest`] that makes sense for chat keeps its meaning, and the
//! server renders `messages` with the model's chat template into the prompt.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Field, RawJson, Section, Usage};

/// The fields only a chat request has (the chat route reads them from the body itself).
pub const CHAT_ONLY_FIELDS: &[Field] = &[
    chat(
        "messages",
        "object[]",
        "required",
        "non-empty: the conversation (below)",
        "O V",
    ),
    chat(
        "add_generation_prompt",
        "bool",
        "`true`",
        "vLLM: end with the start of the assistant's turn",
        "V",
    ),
    chat(
        "continue_final_message",
        "bool",
        "`false`",
        "vLLM: the last message, the assistant's, is left open and the model continues it; \
         not with `add_generation_prompt: true`",
        "V",
    ),
    chat(
        "chat_template_kwargs",
        "object",
        "none",
        "vLLM: an object of more template variables (Qwen 3's `enable_thinking`, …)",
        "V",
    ),
    chat(
        "store",
        "bool",
        "none",
        "OpenAI: accepted; this server stores no conversation either way",
        "O",
    ),
    chat(
        "service_tier",
        "`\"auto\"`, `\"default\"`",
        "`auto`",
        "OpenAI: accepted (there is one tier); any other value is a 400",
        "O",
    ),
];

/// Completion fields whose rule differs in a chat request: these rows replace the
/// completion's in the chat documentation (the field is parsed as for completions).
pub const CHAT_RULES: &[Field] = &[
    chat(
        "max_tokens",
        "int ≥ 0",
        "`--chat-max-tokens`",
        "as for completions, but the default is the server's `--chat-max-tokens` (4096), \
         lowered to fit the context and the limits, not 16",
        "O V",
    ),
    chat(
        "max_completion_tokens",
        "int ≥ 0",
        "—",
        "alias of `max_tokens`, with its chat default",
        "O V",
    ),
    chat(
        "logprobs",
        "bool",
        "`false`",
        "`true` or `false` (an integer is a 400 here): each choice carries `logprobs.content`, \
         per generated token its text, logprob, bytes and `top_logprobs` (0..20) alternatives",
        "O V",
    ),
    chat(
        "tools",
        "object[]",
        "none",
        "functions the model may call: `{\"type\": \"function\", \"function\": {\"name\", \
         \"description\", \"parameters\"}}`; `parameters` a JSON schema (default any object). \
         The template describes them (or, for a template without tools, a system message in \
         the Hermes syntax)",
        "O V",
    ),
    chat(
        "tool_choice",
        "string or object",
        "`auto` with tools",
        "`none`, `auto` (calls in the model's syntax are parsed into `tool_calls`), \
         `required` (one or more calls), or `{\"type\": \"function\", \"function\": \
         {\"name\": …}}` ([Tools](#tools)); anything but `none` without `tools` (absent or \
         empty) is a 400, as OpenAI and vLLM answer it",
        "O V",
    ),
    chat(
        "parallel_tool_calls",
        "bool",
        "`true`",
        "several calls in one answer; `false` allows one",
        "O V",
    ),
];

/// A row of the chat table.
const fn chat(
    name: &'static str,
    ty: &'static str,
    default: &'static str,
    rule: &'static str,
    clients: &'static str,
) -> Field {
    Field {
        name,
        section: Section::Chat,
        ty,
        default,
        rule,
        clients,
    }
}

/// Completion fields a chat request may not carry, and why.
pub const NOT_FOR_CHAT: &[(&str, &str)] = &[
    ("prompt", "a chat request gives `messages`, not `prompt`"),
    ("suffix", "`suffix` is for text completions"),
    ("echo", "`echo` is for text completions"),
    (
        "images",
        "images come as `image_url` content parts of a message",
    ),
    (
        "functions",
        "it is OpenAI's deprecated form of `tools`: send `tools`",
    ),
    (
        "function_call",
        "it is OpenAI's deprecated form of `tool_choice`: send `tool_choice`",
    ),
    (
        "reasoning_effort",
        "the models this server runs do not reason before answering",
    ),
];

/// A function the model called.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

/// One tool call of an assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// `call_…`, for the tool message that answers it.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The call.
    pub function: FunctionCall,
}

/// The assistant's message in a non-streaming answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: String,
    /// The text (`null` when the message is only tool calls).
    pub content: Option<String>,
    /// Always `null`: this server does not refuse.
    pub refusal: Option<String>,
    /// The tools it called; left out of the JSON when there are none, as OpenAI and
    /// vLLM send it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// One alternative token of a chat log-probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes (a token may hold part of a character).
    pub bytes: Vec<u8>,
}

/// One generated token's log-probability in a chat answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely tokens at its position (`top_logprobs` of them).
    pub top_logprobs: Vec<TopLogprob>,
}

/// A chat choice's `logprobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    /// The generated tokens, in order.
    pub content: Vec<TokenLogprob>,
    /// Always `null`.
    pub refusal: Option<Vec<TokenLogprob>>,
}

/// One choice of a non-streaming chat answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// `choice_index`.
    pub index: usize,
    /// What the assistant said.
    pub message: AssistantMessage,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: Option<String>,
    /// The stop string or token id that ended the choice (vLLM).
    pub stop_reason: Option<Value>,
    /// With `return_token_ids`: the generated token ids; `null` otherwise, as vLLM sends it.
    pub token_ids: Option<Vec<u32>>,
}

/// A non-streaming chat answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    /// `chatcmpl-…`.
    pub id: String,
    /// Always `chat.completion`.
    pub object: String,
    /// Unix time of creation.
    pub created: u64,
    /// The model that answered.
    pub model: String,
    /// Identifies the server build.
    pub system_fingerprint: String,
    /// The choices, ordered by index.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
    /// vLLM's `prompt_logprobs` of the rendered prompt, when asked for; `null` otherwise,
    /// as vLLM sends it.
    pub prompt_logprobs: Option<RawJson>,
    /// With `return_token_ids`: the rendered prompt's token ids; `null` otherwise, as vLLM
    /// sends it.
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// The function part of a streamed tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    /// The name, on the call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More of the arguments' JSON text.
    pub arguments: String,
}

/// A streamed tool call: its first delta carries `id`, `type` and the name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// Which call of the message.
    pub index: usize,
    /// `call_…`, on the first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, on the first delta.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The call's name and arguments so far.
    pub function: FunctionCallDelta,
}

/// What a chunk adds to a choice's message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatDelta {
    /// `assistant`, on the choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// More text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice inside a chat stream chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    /// Choice index.
    pub index: usize,
    /// What it adds.
    pub delta: ChatDelta,
    /// Log-probabilities of the tokens behind it, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// Set on the choice's last chunk.
    pub finish_reason: Option<String>,
    /// The stop string or token id, on the last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Value>,
    /// With `return_token_ids`: the ids of the tokens behind this chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// One server-sent event of a streaming chat answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    /// Same id on every chunk of a response.
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: String,
    /// Unix time of creation.
    pub created: u64,
    /// The model.
    pub model: String,
    /// Identifies the server build.
    pub system_fingerprint: String,
    /// Choices with something new (empty on the usage chunk).
    pub choices: Vec<ChatChunkChoice>,
    /// On the last chunk with `stream_options.include_usage` (and every chunk with
    /// `continuous_usage_stats`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// With `return_token_ids`: the rendered prompt's token ids, on the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}
