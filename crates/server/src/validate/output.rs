//! The fields that shape what comes back: logprobs in their three spellings, echo, token
//! spelling, special tokens, and vLLM's `prompt_logprobs` and `return_token_ids`.

use ferrite_protocol::{CompletionRequest, Logprobs};

use super::checks::int_in_range;
use crate::error::ApiError;

/// Most alternatives per token.
pub const MAX_LOGPROBS: i64 = 20;

/// What the answer carries besides the generated text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputOptions {
    /// `Some(k)`: logprobs with the `k` most likely alternatives per token.
    pub logprobs: Option<usize>,
    /// Prepend the prompt (and, with logprobs, its tokens' logprobs).
    pub echo: bool,
    /// Write tokens in logprobs as `token_id:<id>`.
    pub tokens_as_ids: bool,
    /// Leave special tokens out of the text.
    pub skip_special_tokens: bool,
    /// `Some(k)`: vLLM's `prompt_logprobs`, each prompt token with `k` alternatives.
    pub prompt_logprobs: Option<usize>,
    /// vLLM's `return_token_ids`: choices carry `prompt_token_ids` and `token_ids`.
    pub return_token_ids: bool,
}

/// Validates the output fields. `logprobs` is an int (legacy, 0..=20 alternatives) or a
/// bool with `top_logprobs`; `return_token_log_probs` is `logprobs: 0`.
pub fn output_options(r: &CompletionRequest) -> Result<OutputOptions, ApiError> {
    let top = int_in_range("top_logprobs", r.top_logprobs, 0, MAX_LOGPROBS)?;
    let logprobs = match r.logprobs {
        None | Some(Logprobs::Switch(false)) => {
            if top.is_some_and(|k| k > 0) {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs: true`",
                ));
            }
            None
        }
        Some(Logprobs::Switch(true)) => Some(top.unwrap_or(0)),
        Some(Logprobs::Count(k)) => {
            if top.is_some() {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "`top_logprobs` goes with `logprobs: true`; with an integer `logprobs`, that integer is the number of alternatives",
                ));
            }
            int_in_range("logprobs", Some(k), 0, MAX_LOGPROBS)?
        }
    };
    let logprobs = match (logprobs, r.return_token_log_probs) {
        (None, Some(true)) => Some(0),
        (l, _) => l,
    };
    Ok(OutputOptions {
        logprobs,
        echo: r.echo.unwrap_or(false),
        tokens_as_ids: r.return_tokens_as_token_ids.unwrap_or(false),
        skip_special_tokens: r.skip_special_tokens.unwrap_or(true),
        prompt_logprobs: prompt_logprobs(r)?,
        return_token_ids: r.return_token_ids.unwrap_or(false),
    })
}

/// vLLM's `prompt_logprobs`: 0..=20 alternatives per prompt token (vLLM's -1, the whole
/// vocabulary, is over that limit). A non-streaming field: the prompt's scores come in
/// the choice, which a stream has no place for.
fn prompt_logprobs(r: &CompletionRequest) -> Result<Option<usize>, ApiError> {
    let Some(k) = r.prompt_logprobs else {
        return Ok(None);
    };
    if k == -1 {
        return Err(ApiError::invalid(
            "prompt_logprobs",
            format!("`prompt_logprobs: -1` asks for the whole vocabulary at every prompt token; this server gives at most {MAX_LOGPROBS} alternatives"),
        ));
    }
    let k = int_in_range("prompt_logprobs", Some(k), 0, MAX_LOGPROBS)?;
    if r.stream == Some(true) {
        return Err(ApiError::invalid(
            "prompt_logprobs",
            "`prompt_logprobs` cannot be used with `stream`: they come in the non-streaming answer's choices",
        ));
    }
    Ok(k)
}
