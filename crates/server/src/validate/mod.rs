//! Validation at the edge: a wire [`CompletionRequest`] becomes [`GenerateParams`], typed and
//! with defaults resolved, or a 400 naming the field at fault. Checks that need the model
//! (token ids against the vocabulary, lengths against the context) come later, in the
//! route.

mod body;
mod chat;
mod checks;
mod constraint;
mod limits;
mod output;
mod sampling;
mod tool_refs;

#[cfg(test)]
mod fuzz;

use std::sync::Arc;

use ferrite_engine::sampling::SamplingParams;
use ferrite_protocol::{CompletionRequest, PredictionContent, Prompt};

use crate::error::ApiError;
use crate::images::{image_input, ImageInput};
pub use body::{deserialize_body, deserialize_naming_the_field, parse_body};
use body::{drop_unknown, json_object, require};
pub use chat::{parse_chat_body, ChatInput, ChatParams, ToolChoice, CHAT_IMAGE_MARKER};
use checks::{int_in_range, non_negative, token_ids};
pub use constraint::{
    any_call_schema, json_layout, tool_definitions, tool_schema, OutputConstraint, ToolDefinition,
};
pub use limits::FieldLimits;
pub use output::OutputOptions;

/// Default `max_tokens`, as in OpenAI's legacy completions API.
pub const DEFAULT_MAX_TOKENS: usize = 16;
/// Most choices per prompt.
pub const MAX_N: usize = 128;
/// Most candidates per prompt for `best_of`.
pub const MAX_BEST_OF: usize = 20;
/// Most stop strings (OpenAI's rule).
pub const MAX_STOP: usize = 4;
/// Longest `inference_timeout`, in seconds (a day).
pub const MAX_INFERENCE_TIMEOUT: f64 = 86_400.0;

/// A prompt before tokenization.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Text to tokenize (control tokens written in it are parsed).
    Text(String),
    /// A chat template's output whose client text was escaped
    /// (`Tokenizer::escape_specials`): only the template's control tokens are parsed.
    Rendered(String),
    /// Token ids as given.
    Tokens(Vec<u32>),
}

impl PromptInput {
    /// Bytes of text to tokenize (none for token ids).
    pub fn text_bytes(&self) -> usize {
        match self {
            PromptInput::Text(text) | PromptInput::Rendered(text) => text.len(),
            PromptInput::Tokens(_) => 0,
        }
    }
}

/// What to do when prompt plus completion exceed the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Lower `max_tokens` to what fits.
    Truncate,
    /// Answer 400.
    Error,
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
    /// Candidates generated per prompt; the `n` with the best mean logprob are returned.
    pub best_of: usize,
    /// Requested `max_tokens` (`None`: the default, lowered to fit the context); 0 only
    /// with `echo`, to score the prompt.
    pub max_tokens: Option<usize>,
    /// `max_tokens` when none is given (lowered to fit the context and the server's
    /// limits): 16 for a text completion, as OpenAI's legacy API; for chat, whose answer
    /// runs until the model ends it, the server's `--chat-max-tokens`.
    pub default_max_tokens: usize,
    /// `context_length_exceeded_behavior`.
    pub overflow: Overflow,
    /// Keep the end of a prompt that alone exceeds the context.
    pub truncate_sequence: bool,
    /// How tokens are picked (the seed is set per choice later, DRY's breaker tokens
    /// found from `dry_breakers`).
    pub sampling: SamplingParams,
    /// DRY's sequence breakers, as text.
    pub dry_breakers: Vec<String>,
    /// Seed, `None` for a random one.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Extra tokens that end a choice.
    pub stop_token_ids: Vec<u32>,
    /// Keep a matched stop string in the text.
    pub include_stop_str_in_output: bool,
    /// Keep generating past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Tokens before an end may come.
    pub min_tokens: usize,
    /// Logprobs, echo and token spelling.
    pub output: OutputOptions,
    /// Text after the completion.
    pub suffix: Option<String>,
    /// Stream as server-sent events.
    pub stream: bool,
    /// Send a usage chunk at the end of a stream.
    pub include_usage: bool,
    /// Put usage on every chunk (`continuous_usage_stats` with `include_usage`).
    pub continuous_usage: bool,
    /// vLLM's `allowed_token_ids`: only these may be sampled (sorted, distinct).
    pub allowed_token_ids: Option<Arc<[u32]>>,
    /// Wall-clock limit in seconds.
    pub inference_timeout: Option<f64>,
    /// Predicted output text.
    pub prediction: Option<String>,
    /// The structured-output constraint, if a field asks for one.
    pub constraint: Option<OutputConstraint>,
    /// End user, for the logs.
    pub user: Option<String>,
    /// The prompt's images, in order (bytes, decoded when the prompt is prepared).
    pub images: Vec<ImageInput>,
    /// What marks an image's place in the prompt's text.
    pub image_marker: ImageMarker,
}

/// What marks an image's place in a prompt's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImageMarker {
    /// `<image>`, as the completions API's `images` documents it.
    #[default]
    Completion,
    /// The chat route's per-process marker ([`chat::CHAT_IMAGE_MARKER`]).
    Chat,
}

impl ImageMarker {
    /// The marker's text.
    pub fn text(self) -> &'static str {
        match self {
            Self::Completion => "<image>",
            Self::Chat => chat::CHAT_IMAGE_MARKER.as_str(),
        }
    }
}

/// The prompts in their typed forms.
fn prompts(prompt: Prompt) -> Result<Vec<PromptInput>, ApiError> {
    let prompts = match prompt {
        Prompt::Text(t) => vec![PromptInput::Text(t)],
        Prompt::Texts(ts) => ts.into_iter().map(PromptInput::Text).collect(),
        Prompt::Tokens(ids) => vec![PromptInput::Tokens(token_ids("prompt", ids)?)],
        Prompt::TokenLists(lists) => lists
            .into_iter()
            .map(|ids| token_ids("prompt", ids).map(PromptInput::Tokens))
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
    Ok(prompts)
}

/// `max_tokens` and its aliases: two that disagree are a 400. 0 is allowed only to score
/// the prompt with `echo`.
fn max_tokens(r: &CompletionRequest, echo: bool) -> Result<Option<usize>, ApiError> {
    let mut max_tokens: Option<(&str, usize)> = None;
    for (field, value) in [
        ("max_tokens", r.max_tokens),
        ("max_completion_tokens", r.max_completion_tokens),
        ("max_new_tokens", r.max_new_tokens),
    ] {
        let Some(v) = non_negative(field, value)? else {
            continue;
        };
        if v == 0 && !echo {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` must be at least 1 (0 is only allowed with `echo`, to score the prompt)"),
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
    Ok(max_tokens.map(|(_, v)| v))
}

/// `stop` and its alias `stop_sequences`.
fn stop_strings(r: &CompletionRequest, max_bytes: usize) -> Result<Vec<String>, ApiError> {
    if r.stop.is_some() && r.stop_sequences.is_some() && r.stop != r.stop_sequences {
        return Err(ApiError::invalid(
            "stop_sequences",
            "`stop` and `stop_sequences` disagree",
        ));
    }
    let stop = r
        .stop
        .clone()
        .or(r.stop_sequences.clone())
        .map(|s| s.into_vec())
        .unwrap_or_default();
    if stop.len() > MAX_STOP {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOP} stop strings are allowed"),
        ));
    }
    if let Some(long) = stop.iter().find(|s| s.len() > max_bytes) {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "a stop string may be at most {max_bytes} bytes long (`--max-stop-bytes`); one has {}",
                long.len()
            ),
        ));
    }
    Ok(stop)
}

/// `images`: each a `data:` URI or base64, as many as the one text prompt has `<image>`
/// markers. Whether the model reads images is the engine's to say, once the prompt is
/// prepared.
fn check_images(
    r: &CompletionRequest,
    prompts: &[PromptInput],
) -> Result<Vec<ImageInput>, ApiError> {
    let Some(images) = r.images.as_ref().filter(|i| !i.is_empty()) else {
        return Ok(Vec::new());
    };
    let [PromptInput::Text(text)] = prompts else {
        return Err(ApiError::invalid(
            "images",
            "`images` go with one text prompt holding an `<image>` marker for each",
        ));
    };
    let markers = text.matches(ImageMarker::Completion.text()).count();
    if markers != images.len() {
        return Err(ApiError::invalid(
            "images",
            format!(
                "{} image(s) were given for {markers} `<image>` marker(s) in the prompt; the counts must be equal",
                images.len()
            ),
        ));
    }
    images
        .iter()
        .enumerate()
        .map(|(i, reference)| image_input(&format!("images[{i}]"), reference))
        .collect()
}

/// `modalities` and `audio`: only text comes out.
fn check_modalities(r: &CompletionRequest) -> Result<(), ApiError> {
    if let Some(m) = &r.modalities {
        if m.is_empty() || m.iter().any(|x| x != "text") {
            return Err(ApiError::invalid(
                "modalities",
                format!(
                    "this server produces text only; `modalities` must be [\"text\"], got {m:?}"
                ),
            ));
        }
    }
    if r.audio.as_ref().is_some_and(|a| !a.is_null()) {
        return Err(ApiError::invalid(
            "audio",
            "this server produces text only: `audio` output is not available",
        ));
    }
    Ok(())
}

/// `prediction`: `{"type": "content", "content": text or text parts}`.
fn prediction(r: &CompletionRequest) -> Result<Option<String>, ApiError> {
    let Some(p) = &r.prediction else {
        return Ok(None);
    };
    if p.kind != "content" {
        return Err(ApiError::invalid(
            "prediction",
            format!("`prediction.type` must be \"content\", got {:?}", p.kind),
        ));
    }
    match &p.content {
        PredictionContent::Text(t) => Ok(Some(t.clone())),
        PredictionContent::Parts(parts) => {
            if let Some(bad) = parts.iter().find(|part| part.kind != "text") {
                return Err(ApiError::invalid(
                    "prediction",
                    format!(
                        "`prediction.content` parts must have type \"text\", got {:?}",
                        bad.kind
                    ),
                ));
            }
            Ok(Some(parts.iter().map(|part| part.text.as_str()).collect()))
        }
    }
}

impl GenerateParams {
    /// Validates a parsed request against the API's rules and the operator's `limits`;
    /// the error names the field.
    pub fn new(r: CompletionRequest, limits: &FieldLimits) -> Result<Self, ApiError> {
        let n = non_negative("n", r.n)?.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(ApiError::invalid(
                "n",
                format!("`n` must be between 1 and {MAX_N}, got {n}"),
            ));
        }
        let stream = r.stream.unwrap_or(false);
        let best_of = int_in_range("best_of", r.best_of, 1, MAX_BEST_OF as i64)?.unwrap_or(n);
        if best_of < n {
            return Err(ApiError::invalid(
                "best_of",
                format!("`best_of` ({best_of}) must be at least `n` ({n})"),
            ));
        }
        if best_of > n && stream {
            return Err(ApiError::invalid(
                "best_of",
                "`best_of` cannot be used with `stream`: the best choices are known only at the end",
            ));
        }
        let output = output::output_options(&r)?;
        let max_tokens = max_tokens(&r, output.echo)?;
        let overflow = match r.context_length_exceeded_behavior.as_deref() {
            None | Some("truncate") => Overflow::Truncate,
            Some("error") => Overflow::Error,
            Some(other) => {
                return Err(ApiError::invalid(
                    "context_length_exceeded_behavior",
                    format!("`context_length_exceeded_behavior` must be \"truncate\" or \"error\", got {other:?}"),
                ))
            }
        };
        let (sampling, dry_breakers) = sampling::sampling_options(&r, limits)?;
        let allowed_token_ids = sampling::allowed_token_ids(&r, limits.max_allowed_token_ids)?;
        let stop = stop_strings(&r, limits.max_stop_bytes)?;
        let stop_token_ids = token_ids(
            "stop_token_ids",
            r.stop_token_ids.clone().unwrap_or_default(),
        )?;
        if stop_token_ids.len() > limits.max_stop_token_ids {
            return Err(ApiError::invalid(
                "stop_token_ids",
                format!(
                    "at most {} stop token ids are allowed (`--max-stop-token-ids`)",
                    limits.max_stop_token_ids
                ),
            ));
        }
        let min_tokens = non_negative("min_tokens", r.min_tokens)?.unwrap_or(0);
        if let Some(max) = max_tokens {
            if min_tokens > max {
                return Err(ApiError::invalid(
                    "min_tokens",
                    format!("`min_tokens` ({min_tokens}) must not exceed `max_tokens` ({max})"),
                ));
            }
        }
        // Any `stream_options` object (even `{}`) without `stream: true` is a 400, as
        // OpenAI answers it; `null` is no options.
        if !stream && r.stream_options.is_some() {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` is only allowed with `stream: true`",
            ));
        }
        let options = r.stream_options.clone().unwrap_or_default();
        let inference_timeout = match r.inference_timeout {
            None => None,
            Some(t) if t.is_finite() && t > 0.0 && t <= MAX_INFERENCE_TIMEOUT => Some(t),
            Some(t) => {
                return Err(ApiError::invalid(
                    "inference_timeout",
                    format!("`inference_timeout` must be a number of seconds in (0, {MAX_INFERENCE_TIMEOUT}], got {t}"),
                ))
            }
        };
        check_modalities(&r)?;
        let prediction = prediction(&r)?;
        let constraint = constraint::output_constraint(&r, limits.max_tool_name_bytes)?;
        let prompts = prompts(r.prompt.clone())?;
        let images = check_images(&r, &prompts)?;
        Ok(Self {
            model: r.model,
            prompts,
            n,
            best_of,
            max_tokens,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            overflow,
            truncate_sequence: r.truncate_sequence.unwrap_or(false),
            sampling,
            dry_breakers,
            seed: r.seed.map(|s| s as u64),
            stop,
            stop_token_ids,
            include_stop_str_in_output: r.include_stop_str_in_output.unwrap_or(false),
            ignore_eos: r.ignore_eos.unwrap_or(false),
            min_tokens,
            output,
            suffix: r.suffix.filter(|s| !s.is_empty()),
            stream,
            include_usage: options.include_usage == Some(true),
            // vLLM's rule: running usage only where a final usage chunk is asked for.
            continuous_usage: options.include_usage == Some(true)
                && options.continuous_usage_stats == Some(true),
            allowed_token_ids,
            inference_timeout,
            prediction,
            constraint,
            user: r.user,
            images,
            image_marker: ImageMarker::Completion,
        })
    }
}

#[cfg(test)]
mod tests;
