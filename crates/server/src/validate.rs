//! Validation at the edge: a wire [`CompletionRequest`] becomes [`GenerateParams`], typed and
//! with defaults resolved, or a 400 naming the field at fault.

use ferrite_protocol::{CompletionRequest, Prompt, KNOWN_FIELDS};
use serde_json::Value;

use crate::error::ApiError;

/// Default `max_tokens`, as in OpenAI's legacy completions API.
pub const DEFAULT_MAX_TOKENS: usize = 16;
/// Most choices per prompt.
pub const MAX_N: usize = 128;
/// Most stop strings.
pub const MAX_STOP: usize = 4;

/// A prompt before tokenization.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Text to tokenize.
    Text(String),
    /// Token ids as given.
    Tokens(Vec<u32>),
}

/// A validated completion request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    /// Requested model name.
    pub model: String,
    /// The prompts; each yields `n` choices.
    pub prompts: Vec<PromptInput>,
    /// Choices per prompt.
    pub n: usize,
    /// Requested `max_tokens` (`None`: the default, lowered to fit the context).
    pub max_tokens: Option<usize>,
    /// 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Top-k, `None` when off.
    pub top_k: Option<usize>,
    /// Seed, `None` for a random one.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stream as server-sent events.
    pub stream: bool,
    /// Send a usage chunk at the end of a stream.
    pub include_usage: bool,
    /// Keep generating past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// End user, for the logs.
    pub user: Option<String>,
}

/// Parses a request body: JSON syntax, unknown fields, then types, each error naming its
/// field. With `ignore_unknown`, fields no vendor documents are dropped instead.
pub fn parse_body(body: &[u8], ignore_unknown: bool) -> Result<CompletionRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid_body(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(ApiError::invalid_body("the body must be a JSON object"));
    };
    let unknown: Vec<String> = map
        .keys()
        .filter(|k| !KNOWN_FIELDS.contains(&k.as_str()))
        .cloned()
        .collect();
    if let Some(first) = unknown.first() {
        if !ignore_unknown {
            return Err(ApiError::invalid(
                first.clone(),
                format!("Unrecognized request argument supplied: {first}"),
            ));
        }
        for key in &unknown {
            map.remove(key);
        }
    }
    for required in ["model", "prompt"] {
        if map.get(required).is_none_or(Value::is_null) {
            return Err(ApiError::invalid(
                required,
                format!("`{required}` is required"),
            ));
        }
    }
    serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
        let path = e.path().to_string();
        let param = path
            .split(['.', '['])
            .next()
            .unwrap_or_default()
            .to_string();
        let message = match param.as_str() {
            "prompt" => "`prompt` must be a string, an array of strings, an array of token ids \
                         or an array of arrays of token ids"
                .to_string(),
            "stop" | "stop_sequences" => {
                format!("`{param}` must be a string or an array of strings")
            }
            _ => format!("invalid value for `{path}`: {}", e.into_inner()),
        };
        ApiError::invalid(param, message)
    })
}

/// A field that is accepted only while it asks for nothing, because what it asks for is
/// not built yet: a non-neutral value is refused, never silently ignored.
fn check_not_yet_supported(field: &str, value: &Value, n: usize) -> Result<(), ApiError> {
    let neutral = match field {
        // Accepted with no effect on the output, by definition.
        "user"
        | "inference_extra_params"
        | "inference_extra_headers"
        | "metadata"
        | "priority"
        | "parallel_tool_calls" => true,
        "suffix" => value.is_null() || value == "",
        "echo" | "truncate_sequence" | "return_token_log_probs" | "return_tokens_as_token_ids" => {
            value.is_null() || value == false
        }
        "skip_special_tokens" => value.is_null() || value == true,
        "logprobs" => value.is_null() || value == false,
        "top_logprobs" | "min_p" | "frequency_penalty" | "presence_penalty" | "min_tokens"
        | "dry_multiplier" => value.is_null() || value.as_f64() == Some(0.0),
        "typical_p" | "repetition_penalty" => value.is_null() || value.as_f64() == Some(1.0),
        "best_of" => value.is_null() || value.as_u64() == Some(n as u64),
        "logit_bias" => value.is_null() || value.as_object().is_some_and(|m| m.is_empty()),
        "context_length_exceeded_behavior" => value.is_null() || value == "truncate",
        "response_format" => {
            value.is_null() || value.get("type").and_then(Value::as_str) == Some("text")
        }
        "tools" | "images" => value.is_null() || value.as_array().is_some_and(Vec::is_empty),
        "tool_choice" => value.is_null() || value == "none" || value == "auto",
        "modalities" => value.is_null() || *value == serde_json::json!(["text"]),
        _ => value.is_null(),
    };
    if neutral {
        Ok(())
    } else {
        Err(ApiError::invalid(
            field,
            format!("`{field}` is not supported by this server yet; leave it out or set it to its default"),
        ))
    }
}

fn non_negative(field: &str, v: Option<i64>) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x >= 0 => Ok(Some(x as usize)),
        Some(x) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be non-negative, got {x}"),
        )),
    }
}

fn token_ids(ids: Vec<i64>) -> Result<Vec<u32>, ApiError> {
    ids.into_iter()
        .map(|t| {
            u32::try_from(t)
                .map_err(|_| ApiError::invalid("prompt", format!("token id {t} is out of range")))
        })
        .collect()
}

impl TryFrom<CompletionRequest> for GenerateParams {
    type Error = ApiError;

    fn try_from(r: CompletionRequest) -> Result<Self, ApiError> {
        let n = non_negative("n", r.n)?.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(ApiError::invalid(
                "n",
                format!("`n` must be between 1 and {MAX_N}, got {n}"),
            ));
        }
        for (field, value) in &r.other {
            check_not_yet_supported(field, value, n)?;
        }
        let prompts = match r.prompt {
            Prompt::Text(t) => vec![PromptInput::Text(t)],
            Prompt::Texts(ts) => ts.into_iter().map(PromptInput::Text).collect(),
            Prompt::Tokens(ids) => vec![PromptInput::Tokens(token_ids(ids)?)],
            Prompt::TokenLists(lists) => lists
                .into_iter()
                .map(|ids| token_ids(ids).map(PromptInput::Tokens))
                .collect::<Result<_, _>>()?,
        };
        if prompts.is_empty() {
            return Err(ApiError::invalid(
                "prompt",
                "`prompt` must not be an empty list",
            ));
        }
        if prompts
            .iter()
            .any(|p| matches!(p, PromptInput::Tokens(t) if t.is_empty()))
        {
            return Err(ApiError::invalid(
                "prompt",
                "a token-id prompt must not be empty",
            ));
        }
        let mut max_tokens = None;
        for (field, value) in [
            ("max_tokens", r.max_tokens),
            ("max_completion_tokens", r.max_completion_tokens),
            ("max_new_tokens", r.max_new_tokens),
        ] {
            let Some(v) = non_negative(field, value)? else {
                continue;
            };
            if v == 0 {
                return Err(ApiError::invalid(
                    field,
                    format!("`{field}` must be at least 1"),
                ));
            }
            if let Some((other, previous)) = max_tokens {
                if previous != v {
                    return Err(ApiError::invalid(
                        field,
                        format!("`{field}` ({v}) conflicts with `{other}` ({previous})"),
                    ));
                }
            }
            max_tokens = Some((field, v));
        }
        let temperature = r.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                "temperature",
                format!("`temperature` must be between 0 and 2, got {temperature}"),
            ));
        }
        let top_p = r.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                "top_p",
                format!("`top_p` must be in (0, 1], got {top_p}"),
            ));
        }
        let top_k = match r.top_k {
            None | Some(0) | Some(-1) => None,
            Some(k) if k > 0 => Some(k as usize),
            Some(k) => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("`top_k` must be positive, 0 or -1, got {k}"),
                ))
            }
        };
        if r.stop.is_some() && r.stop_sequences.is_some() && r.stop != r.stop_sequences {
            return Err(ApiError::invalid(
                "stop_sequences",
                "`stop` and `stop_sequences` disagree",
            ));
        }
        let stop = r
            .stop
            .or(r.stop_sequences)
            .map(|s| s.into_vec())
            .unwrap_or_default();
        if stop.len() > MAX_STOP {
            return Err(ApiError::invalid(
                "stop",
                format!("at most {MAX_STOP} stop strings are allowed"),
            ));
        }
        for (field, set) in [
            (
                "include_stop_str_in_output",
                r.include_stop_str_in_output == Some(true),
            ),
            (
                "stop_token_ids",
                r.stop_token_ids.as_ref().is_some_and(|v| !v.is_empty()),
            ),
        ] {
            if set {
                return Err(ApiError::invalid(
                    field,
                    format!("`{field}` is not supported by this server yet; leave it out or set it to its default"),
                ));
            }
        }
        let stream = r.stream.unwrap_or(false);
        let options = r.stream_options.unwrap_or_default();
        if !stream && (options.include_usage.is_some() || options.continuous_usage_stats.is_some())
        {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` needs `stream: true`",
            ));
        }
        if options.continuous_usage_stats == Some(true) {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options.continuous_usage_stats` is not supported by this server yet",
            ));
        }
        Ok(Self {
            model: r.model,
            prompts,
            n,
            max_tokens: max_tokens.map(|(_, v)| v),
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k,
            seed: r.seed.map(|s| s as u64),
            stop,
            stream,
            include_usage: options.include_usage == Some(true),
            ignore_eos: r.ignore_eos.unwrap_or(false),
            user: r.user,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<GenerateParams, ApiError> {
        GenerateParams::try_from(parse_body(body.as_bytes(), false)?)
    }

    fn param_of(e: ApiError) -> Option<String> {
        match e {
            ApiError::InvalidRequest { param, .. } => param,
            _ => None,
        }
    }

    #[test]
    fn defaults_resolve() {
        let p = parse(r#"{"model":"m","prompt":"hi"}"#).unwrap();
        assert_eq!(p.n, 1);
        assert_eq!(p.temperature, 1.0);
        assert_eq!(p.max_tokens, None);
        assert_eq!(p.prompts, vec![PromptInput::Text("hi".into())]);
    }

    #[test]
    fn all_prompt_shapes_parse() {
        assert_eq!(
            parse(r#"{"model":"m","prompt":["a","b"]}"#)
                .unwrap()
                .prompts
                .len(),
            2
        );
        assert_eq!(
            parse(r#"{"model":"m","prompt":[1,2]}"#).unwrap().prompts,
            vec![PromptInput::Tokens(vec![1, 2])]
        );
        assert_eq!(
            parse(r#"{"model":"m","prompt":[[1],[2,3]]}"#)
                .unwrap()
                .prompts
                .len(),
            2
        );
    }

    #[test]
    fn errors_name_their_field() {
        let cases = [
            (
                r#"{"model":"m","prompt":"x","temperature":5}"#,
                "temperature",
            ),
            (
                r#"{"model":"m","prompt":"x","temperature":"hot"}"#,
                "temperature",
            ),
            (r#"{"model":"m","prompt":"x","top_p":0}"#, "top_p"),
            (r#"{"model":"m","prompt":"x","n":0}"#, "n"),
            (r#"{"model":"m","prompt":"x","bogus":1}"#, "bogus"),
            (
                r#"{"model":"m","prompt":"x","frequency_penalty":1.5}"#,
                "frequency_penalty",
            ),
            (
                r#"{"model":"m","prompt":"x","max_tokens":5,"max_new_tokens":6}"#,
                "max_new_tokens",
            ),
            (
                r#"{"model":"m","prompt":"x","stop":["a","b","c","d","e"]}"#,
                "stop",
            ),
            (
                r#"{"model":"m","prompt":"x","stream_options":{"include_usage":true}}"#,
                "stream_options",
            ),
            (r#"{"model":"m"}"#, "prompt"),
            (r#"{"model":"m","prompt":[-1]}"#, "prompt"),
        ];
        for (body, field) in cases {
            let err = parse(body).expect_err(body);
            assert_eq!(param_of(err), Some(field.to_string()), "{body}");
        }
    }

    #[test]
    fn neutral_values_of_unbuilt_fields_are_accepted() {
        let p = parse(
            r#"{"model":"m","prompt":"x","frequency_penalty":0,"echo":false,"logprobs":null,"best_of":1,"logit_bias":{}}"#,
        );
        assert!(p.is_ok(), "{p:?}");
    }

    #[test]
    fn shape_errors_say_what_shapes_are_allowed() {
        let err = parse(r#"{"model":"m","prompt":{"a":1}}"#).unwrap_err();
        assert!(
            err.to_string()
                .contains("must be a string, an array of strings"),
            "{err}"
        );
        let err = parse(r#"{"model":"m","prompt":"x","stop":5}"#).unwrap_err();
        assert_eq!(param_of(err), Some("stop".into()));
    }

    #[test]
    fn bad_json_is_a_400_without_param() {
        let err = parse_body(b"{not json", false).unwrap_err();
        assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(param_of(err), None);
    }
}
