//! The body of `POST /v1/completions`, as clients send it.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

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

crate::wire_fields! {
    /// A completion request as received: every field that any of the supported vendors
    /// documents for `POST /v1/completions`, each declared once with its documentation
    /// row ([`crate::fields`]). Unknown fields are found before parsing, by
    /// [`KNOWN_FIELDS`].
    #[derive(Debug, Clone, PartialEq, Deserialize)]
    pub struct CompletionRequest, names: KNOWN_FIELDS, fields: COMPLETION_FIELDS {
        /// a served name, `default`, or a path whose last `/` segment is a served name
        /// (`accounts/x/models/NAME`); otherwise 404 `model_not_found`
        #[field(Prompt, "string", "required", "all")]
        pub model: String,
        /// each prompt gets `n` choices; an empty list or empty token list is a 400, so is an
        /// id outside the vocabulary
        #[field(Prompt, "string, string[], int[], int[][]", "required", "all")]
        pub prompt: Prompt,
        /// with a model that has fill-in-the-middle tokens, the prompt is encoded as FIM (then
        /// `echo` is a 400: the prompt that runs is not the text sent); otherwise the suffix is
        /// appended to every choice's text; `""` is none
        #[field(Prompt, "string", "none", "O V M G")]
        pub suffix: Option<String>,
        /// most tokens per choice; 0 only with `echo` (scores the prompt, generates nothing).
        /// The default, when none is given, is lowered to what fits the context and the
        /// request's share of the [limits](#limits), whatever
        /// `context_length_exceeded_behavior` says
        #[field(Prompt, "int ≥ 0", "16", "all")]
        pub max_tokens: Option<i64>,
        /// alias of `max_tokens`; two given with different values: 400 naming the later one
        #[field(Prompt, "int ≥ 0", "—", "V G")]
        pub max_completion_tokens: Option<i64>,
        /// alias of `max_tokens`; two given with different values: 400 naming the later one
        #[field(Prompt, "int ≥ 0", "—", "G")]
        pub max_new_tokens: Option<i64>,
        /// prompt + `max_tokens` over the context: `truncate` lowers `max_tokens` to what fits,
        /// `error` is a 400 on `max_tokens`
        #[field(Prompt, "`\"truncate\"`, `\"error\"`", "`truncate`", "F")]
        pub context_length_exceeded_behavior: Option<String>,
        /// a prompt that alone fills the context keeps its last `ctx − max_tokens` tokens (at
        /// least 1) instead of a 400 on `prompt`
        #[field(Prompt, "bool", "false", "M")]
        pub truncate_sequence: Option<bool>,
        /// [0, 2]; 0 is greedy
        #[field(Sampling, "number", "1", "all")]
        pub temperature: Option<f64>,
        /// (0, 1]
        #[field(Sampling, "number", "1", "all")]
        pub top_p: Option<f64>,
        /// positive; 0 and -1 are off
        #[field(Sampling, "int", "off", "V F M G")]
        pub top_k: Option<i64>,
        /// [0, 1]: drop tokens below `min_p` × the top probability
        #[field(Sampling, "number", "0", "V M")]
        pub min_p: Option<f64>,
        /// (0, 1]
        #[field(Sampling, "number", "1", "F")]
        pub typical_p: Option<f64>,
        /// [-2, 2], OpenAI's formula over generated tokens
        #[field(Sampling, "number", "0", "O V F M G")]
        pub frequency_penalty: Option<f64>,
        /// [-2, 2], OpenAI's formula over generated tokens
        #[field(Sampling, "number", "0", "O V F M G")]
        pub presence_penalty: Option<f64>,
        /// (0, 2], multiplicative, over prompt and generated tokens
        #[field(Sampling, "number", "1", "V F M")]
        pub repetition_penalty: Option<f64>,
        /// at most 1024 entries (`--max-logit-bias`); keys token ids, values [-100, 100]; an id
        /// outside the vocabulary: 400
        #[field(Sampling, "object `{\"<id>\": number}`", "none", "O V M G")]
        pub logit_bias: Option<BTreeMap<String, f64>>,
        /// choice *i* of a seeded request samples from its own generator, so the same request
        /// gives the same output whatever else runs
        #[field(Sampling, "int (64-bit)", "random", "O V G")]
        pub seed: Option<i64>,
        /// (0, 64]; turns Mirostat 2.0 on (tau), replacing top-k/p, min-p and typical-p
        #[field(Sampling, "number", "off", "F")]
        pub mirostat_target: Option<f64>,
        /// (0, 1]; eta
        #[field(Sampling, "number", "0.1", "F")]
        pub mirostat_lr: Option<f64>,
        /// [0, 100]; 0 leaves DRY off
        #[field(Sampling, "number", "0", "M")]
        pub dry_multiplier: Option<f64>,
        /// [1, 16]
        #[field(Sampling, "number", "1.75", "M")]
        pub dry_base: Option<f64>,
        /// [0, 1024]
        #[field(Sampling, "int", "2", "M")]
        pub dry_allowed_length: Option<i64>,
        /// at most 32 (`--max-dry-breakers`) non-empty strings of at most 64 bytes
        #[field(Sampling, "string[]", "`[\"\\n\", \":\", \"\\\"\", \"*\"]`", "M")]
        pub dry_sequence_breakers: Option<Vec<String>>,
        /// [1, 128] choices per prompt; the prompt is computed once for all of them
        #[field(Choices, "int", "1", "O V F M G")]
        pub n: Option<i64>,
        /// [1, 20] and ≥ `n`: that many candidates, the `n` with the highest mean token logprob
        /// returned; above `n` with `stream`: 400
        #[field(Choices, "int", "`n`", "O V M G")]
        pub best_of: Option<i64>,
        /// at most 4 strings of at most 512 bytes (`--max-stop-bytes`), matched on the text
        /// across token boundaries
        #[field(Choices, "string or string[]", "none", "all")]
        pub stop: Option<Stop>,
        /// alias of `stop`; both given and different: 400 on `stop_sequences`
        #[field(Choices, "string or string[]", "none", "G")]
        pub stop_sequences: Option<Stop>,
        /// keep the matched stop string in `text`
        #[field(Choices, "bool", "false", "V G")]
        pub include_stop_str_in_output: Option<bool>,
        /// at most 64 ids in the vocabulary that end a choice
        #[field(Choices, "int[]", "none", "V")]
        pub stop_token_ids: Option<Vec<i64>>,
        /// generate past end-of-generation tokens
        #[field(Choices, "bool", "false", "V F")]
        pub ignore_eos: Option<bool>,
        /// until this many tokens, end-of-generation and stop tokens are banned and stop
        /// strings do not match; more than `max_tokens`: 400
        #[field(Choices, "int ≥ 0", "0", "V")]
        pub min_tokens: Option<i64>,
        /// the prompt starts each choice's `text`; with logprobs, its tokens are scored too.
        /// The echoed text is the prompt's tokens decoded as they ran (after
        /// `truncate_sequence`), special tokens (a BOS the model adds, `<|im_end|>` in the
        /// text) left out unless `skip_special_tokens` is false
        #[field(Output, "bool", "false", "O V F M")]
        pub echo: Option<bool>,
        /// int [0, 20]: the [logprobs object](#logprobs) with that many alternatives per token;
        /// `true`: the same with `top_logprobs` alternatives; `false`: none
        #[field(Output, "int or bool", "none", "O V F M G")]
        pub logprobs: Option<Logprobs>,
        /// [0, 20]; above 0 needs `logprobs: true`; any value beside an integer `logprobs` is a
        /// 400 (both on `top_logprobs`)
        #[field(Output, "int", "0", "G")]
        pub top_logprobs: Option<i64>,
        /// `true` acts as `logprobs: 0` when `logprobs` is absent or `false`
        #[field(Output, "bool", "false", "G")]
        pub return_token_log_probs: Option<bool>,
        /// tokens in `logprobs` spelled `token_id:<id>`
        #[field(Output, "bool", "false", "V")]
        pub return_tokens_as_token_ids: Option<bool>,
        /// leave special tokens out of `text`, the echoed prompt's included
        #[field(Output, "bool", "true", "V")]
        pub skip_special_tokens: Option<bool>,
        /// answer as [server-sent events](#streaming)
        #[field(Output, "bool", "false", "all")]
        pub stream: Option<bool>,
        /// `include_usage`, `continuous_usage_stats` (bools, no other key); any object (even
        /// `{}`) without `stream: true` is a 400, as OpenAI answers it (`null` is none).
        /// `continuous_usage_stats` has an effect only with `include_usage` (vLLM's rule)
        #[field(
            Output,
            "object `{\"include_usage\": bool, \"continuous_usage_stats\": bool}`",
            "none",
            "O V G"
        )]
        pub stream_options: Option<StreamOptions>,
        /// [0, 20]; see below; not with `stream`
        #[field(Output, "int", "none", "V")]
        pub prompt_logprobs: Option<i64>,
        /// see below
        #[field(Output, "int[]", "none", "V")]
        pub allowed_token_ids: Option<Vec<i64>>,
        /// see below
        #[field(Output, "bool", "false", "V")]
        pub return_token_ids: Option<bool>,
        /// `type` is `text` (no constraint), `json_object` (any object, or the JSON schema in
        /// `schema` beside it), `json_schema` (needs `json_schema.schema`) or `grammar`
        /// (`grammar`: a string in llguidance's Lark dialect)
        #[field(Structured, "object", "none", "V F G")]
        pub response_format: Option<Value>,
        /// a JSON schema, or its JSON text
        #[field(Structured, "object, bool or string", "none", "V G")]
        pub guided_json: Option<Value>,
        /// the whole output matches it
        #[field(Structured, "string", "none", "V G")]
        pub guided_regex: Option<String>,
        /// non-empty; the output is exactly one of the strings
        #[field(Structured, "string[]", "none", "V G")]
        pub guided_choice: Option<Vec<String>>,
        /// a Lark grammar (llguidance dialect)
        #[field(Structured, "string", "none", "V G")]
        pub guided_grammar: Option<String>,
        /// `{"type": T, "value": V}`: `regex` and `lark` take a string, `json_schema` a schema,
        /// `llguidance` a string or a JSON object
        #[field(Structured, "object", "none", "M")]
        pub grammar: Option<Value>,
        /// `{"type": "function", "function": {"name", "parameters"}}`; entries checked only
        /// when `tool_choice` constrains
        #[field(Structured, "object[]", "none", "M G")]
        pub tools: Option<Vec<Value>>,
        /// `none`, `auto` (output free), `required` (output is one call of any tool) or
        /// `{"type": "function", "function": {"name": N}}` (a call of N, which must be in
        /// `tools`); the [chat route](#tools) reads calls back into `tool_calls`
        #[field(Structured, "string or object", "none", "M G")]
        pub tool_choice: Option<Value>,
        /// accepted; one call is generated
        #[field(Structured, "bool", "none", "G")]
        pub parallel_tool_calls: Option<bool>,
        /// seconds, (0, 86400]; capped by `--request-timeout`; past it, 504 or a stream's error
        /// event
        #[field(Other, "number", "none", "G")]
        pub inference_timeout: Option<f64>,
        /// `{"type": "content", "content": TEXT}`, content a string or a list of `{"type":
        /// "text", "text": …}`; verified as draft tokens, the output identical to a run without
        /// it
        #[field(Other, "object", "none", "G")]
        pub prediction: Option<Prediction>,
        /// `data:image/…;base64,…` URIs (or bare base64) of PNG, JPEG, WebP or GIF images,
        /// or `http(s)` URLs of hosts `--allowed-media-domains` allows, one per `<image>` marker in the one text prompt, in order; only with a vision
        /// model (`--mmproj`), else a 400; each error names `images[i]`; at most
        /// `--max-images`, each at most `--max-image-pixels`; not with `echo`,
        /// `prompt_logprobs` or `suffix`
        #[field(Other, "string[]", "none", "F")]
        pub images: Option<Vec<String>>,
        /// must be `["text"]` (non-empty, only `"text"`)
        #[field(Other, "string[]", "none", "G")]
        pub modalities: Option<Vec<String>>,
        /// anything but `null` is a 400
        #[field(Other, "any", "none", "G")]
        pub audio: Option<Value>,
        /// written to the log
        #[field(Other, "string", "none", "O V F M G")]
        pub user: Option<String>,
        /// accepted, no effect
        #[field(Other, "object", "none", "F G")]
        pub metadata: Option<serde_json::Map<String, Value>>,
        /// accepted, no effect
        #[field(Other, "object", "none", "F G")]
        pub inference_extra_params: Option<serde_json::Map<String, Value>>,
        /// accepted, no effect
        #[field(Other, "object", "none", "F G")]
        pub inference_extra_headers: Option<serde_json::Map<String, Value>>,
        /// accepted, no effect
        #[field(Other, "int", "none", "V F G")]
        pub priority: Option<i64>,
    }
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
