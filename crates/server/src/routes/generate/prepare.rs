//! From validated parameters to engine requests: prompts tokenized (with the suffix as
//! fill-in-the-middle when the model can), the context rules applied, token ids checked
//! against the vocabulary, and one group of sequences per prompt.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite_engine::constrain::Constraint;
use ferrite_engine::tokenizer::{TokenId, Tokenizer};
use ferrite_engine::vision::prompt::{view_hash, PromptImage};
use ferrite_engine::vision::ImagePart;
use ferrite_engine::{EngineHandle, SequenceRequest};

use crate::error::ApiError;
use crate::images::{decode_all, ImageInput};
use crate::state::RequestLimits;
use crate::validate::{GenerateParams, ImageMarker, Overflow, PromptInput};

/// The prompt as `echo` returns it: its tokens decoded (special tokens spelled out only
/// with `skip_special_tokens: false`), and the characters each token adds, so that the
/// logprobs' `text_offset` of every echoed token indexes this text.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Echo {
    /// The text `echo` prepends.
    pub text: String,
    /// Characters each prompt token adds to `text`, in order (empty without `echo`).
    pub token_chars: Vec<usize>,
}

impl Echo {
    /// The echo of `tokens`, the prompt as it runs (after the context rules).
    fn of(tokenizer: &Tokenizer, tokens: &[TokenId], skip_special_tokens: bool) -> Self {
        let pieces = tokenizer.decode_pieces(tokens, !skip_special_tokens);
        Self {
            token_chars: pieces.iter().map(|p| p.chars().count()).collect(),
            text: pieces.concat(),
        }
    }
}

/// One prompt ready to run: its tokens, what to echo, and its sequences.
#[derive(Debug)]
pub struct PreparedPrompt {
    /// What `echo` prepends (empty without `echo`).
    pub echo: Echo,
    /// The prompt's token ids as they run, for `return_token_ids` (else `None`).
    pub token_ids: Option<Vec<TokenId>>,
    /// Its length in tokens, after the context rules.
    pub prompt_tokens: usize,
    /// The sequences of its choices (`best_of` of them), sharing the prompt.
    pub requests: Vec<SequenceRequest>,
}

/// Everything a request runs.
#[derive(Debug)]
pub struct Prepared {
    /// One entry per prompt, in order.
    pub prompts: Vec<PreparedPrompt>,
    /// Text appended to every choice (a suffix the model cannot fill in the middle of).
    pub appended_suffix: Option<String>,
}

/// Prepares every prompt of a request within the server's per-request limits. Runs off
/// the async workers: tokenizing long prompts takes a while, and stops once `cancelled`
/// is set (the client went away).
pub fn prepare(
    params: &GenerateParams,
    engine: &EngineHandle,
    limits: &RequestLimits,
    constraint: Option<Constraint>,
    cancelled: &AtomicBool,
) -> Result<Prepared, ApiError> {
    let (tokenizer, context) = (engine.tokenizer().as_ref(), engine.context_length());
    let fim = params.suffix.is_some() && tokenizer.fim().is_some();
    if fim && params.output.echo {
        // The prompt that runs interleaves the text and the suffix around FIM tokens: no
        // echo of it would be the text the client sent.
        return Err(ApiError::invalid(
            "echo",
            "`echo` cannot be combined with a `suffix` this model fills in the middle of",
        ));
    }
    let base_seed = params.seed.unwrap_or_else(rand::random);
    let mut template = base_request(params, tokenizer);
    // Each choice gets its own copy of the compiled grammar.
    template.constraint = constraint;
    let mut prompts = Vec::with_capacity(params.prompts.len());
    let mut prompt_images = Vec::new();
    for (p, input) in params.prompts.iter().enumerate() {
        let tokens = match input {
            _ if !params.images.is_empty() => {
                refuse_textless_fields(params)?;
                let (tokens, images) = encode_with_images(
                    engine,
                    limits,
                    input,
                    &params.images,
                    params.image_marker,
                    cancelled,
                )?;
                prompt_images = images;
                tokens
            }
            PromptInput::Text(text) => match (&params.suffix, fim) {
                (Some(suffix), true) => tokenizer
                    .encode_fill_in_middle(text, suffix)
                    .expect("the model has FIM tokens"),
                _ => tokenizer.encode_prompt_until(text, cancelled)?,
            },
            PromptInput::Rendered(text) => {
                tokenizer.encode_rendered_until(text, true, cancelled)?
            }
            PromptInput::Tokens(ids) => ids.clone(),
        };
        let before = tokens.len();
        let (tokens, mut max_tokens) = fit_context(params, tokens, context)?;
        if !prompt_images.is_empty() && tokens.len() != before {
            return Err(ApiError::invalid(
                "truncate_sequence",
                "a prompt with images is not cut to fit the context: shorten its text or send fewer images",
            ));
        }
        if params.max_tokens.is_none() {
            max_tokens =
                default_within_limits(max_tokens, tokens.len(), params, limits, engine.kv_budget());
        }
        let requests: Vec<SequenceRequest> = (0..params.best_of)
            .map(|j| {
                let mut r = template.clone();
                r.prompt = tokens.clone();
                r.images = prompt_images.clone();
                r.max_tokens = max_tokens;
                r.min_tokens = params.min_tokens.min(max_tokens);
                r.sampling.seed = choice_seed(base_seed, p * params.best_of + j);
                r
            })
            .collect();
        // The engine's check, before anything decodes the ids (the echo): the first
        // request whole, the other prompts' own ids.
        match p {
            0 => engine.check(&requests[0])?,
            _ => engine.check_prompt(&tokens)?,
        }
        let echo = if params.output.echo {
            Echo::of(tokenizer, &tokens, params.output.skip_special_tokens)
        } else {
            Echo::default()
        };
        prompts.push(PreparedPrompt {
            echo,
            token_ids: params.output.return_token_ids.then(|| tokens.clone()),
            prompt_tokens: tokens.len(),
            requests,
        });
    }
    check_limits(&prompts, limits)?;
    check_answer_size(params, &prompts, limits, engine.kv_budget())?;
    Ok(Prepared {
        prompts,
        appended_suffix: params.suffix.clone().filter(|_| !fim),
    })
}

/// A 400 for the fields that need a prompt's text where images have none.
fn refuse_textless_fields(params: &GenerateParams) -> Result<(), ApiError> {
    for (field, asked) in [
        ("echo", params.output.echo),
        ("prompt_logprobs", params.output.prompt_logprobs.is_some()),
        ("suffix", params.suffix.is_some()),
    ] {
        if asked {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` cannot be used with images (an image's positions have no text)"),
            ));
        }
    }
    Ok(())
}

/// The tokens of a prompt with images, and its images' views: the text's pieces between
/// the image markers tokenized apart (the first with the model's BOS), and in each
/// marker's place the image's layout (llama.cpp's `mtmd` chunks): the projector's text
/// around its views, each tokenized apart, and each view's placeholder positions. The
/// images are decoded and preprocessed here, off the async workers, within the server's
/// limits; an error about them all names `images`.
pub fn encode_with_images(
    engine: &EngineHandle,
    limits: &RequestLimits,
    input: &PromptInput,
    images: &[ImageInput],
    marker: ImageMarker,
    cancelled: &AtomicBool,
) -> Result<(Vec<TokenId>, Vec<PromptImage>), ApiError> {
    let Some(vision) = engine.vision() else {
        // A chat request's error names the part; a completion's its `images`.
        let field = match (marker, images.first()) {
            (ImageMarker::Chat, Some(first)) => first.field.as_str(),
            _ => "images",
        };
        return Err(ApiError::invalid(
            field,
            "this model reads text only: images need a vision model (`ferrite serve --mmproj`)",
        ));
    };
    let decoded = decode_all(images, &limits.images)?;
    let tokenizer = engine.tokenizer();
    let (text, rendered) = match input {
        PromptInput::Text(text) => (text, false),
        PromptInput::Rendered(text) => (text, true),
        PromptInput::Tokens(_) => {
            return Err(ApiError::invalid("images", "images go with a text prompt"))
        }
    };
    let pieces: Vec<&str> = text.split(marker.text()).collect();
    if pieces.len() != decoded.len() + 1 {
        return Err(ApiError::invalid(
            "images",
            format!(
                "the prompt has {} image marker(s) for {} image(s)",
                pieces.len() - 1,
                decoded.len()
            ),
        ));
    }
    // The images' positions, known from their sizes, checked before any is preprocessed
    // (a projector that tiles an image holds every tile's pixels until it is encoded).
    let positions: usize = decoded
        .iter()
        .map(|d| vision.positions(d.image.width, d.image.height))
        .sum();
    let most = limits.max_prompt_tokens.min(engine.context_length());
    if positions > most {
        return Err(ApiError::invalid(
            "images",
            format!(
                "the images take {positions} prompt positions; at most {most} fit \
                 (the context, and --max-prompt-tokens)"
            ),
        ));
    }
    let mut tokens = Vec::new();
    let mut images = Vec::with_capacity(decoded.len());
    for (k, piece) in pieces.iter().enumerate() {
        let first = k == 0;
        tokens.extend(match (rendered, first) {
            (true, _) => tokenizer.encode_rendered_until(piece, first, cancelled)?,
            (false, true) => tokenizer.encode_prompt_until(piece, cancelled)?,
            (false, false) => tokenizer.encode_until(piece, true, cancelled)?,
        });
        let Some(image) = decoded.get(k) else {
            break;
        };
        let mut views = 0;
        for part in vision.layout(&image.image) {
            match part {
                ImagePart::Text(text) => tokens.extend(tokenizer.encode(&text, true)),
                ImagePart::View { pixels, tokens: n } => {
                    let view = PromptImage {
                        start: tokens.len(),
                        tokens: n,
                        hash: view_hash(&image.hash, views),
                        image: Arc::new(pixels),
                    };
                    views += 1;
                    tokens.extend(view.placeholders());
                    images.push(view);
                }
            }
        }
    }
    Ok((tokens, images))
}

/// A 400 when the request's prompts together are longer than `--max-prompt-tokens`, or
/// its sequences together may generate more than `--max-request-tokens`.
fn check_limits(prompts: &[PreparedPrompt], limits: &RequestLimits) -> Result<(), ApiError> {
    let prompt_tokens: usize = prompts.iter().map(|p| p.prompt_tokens).sum();
    if prompt_tokens > limits.max_prompt_tokens {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "the request's prompts have {prompt_tokens} tokens together; this server takes at most {} per request",
                limits.max_prompt_tokens
            ),
        ));
    }
    let generated: usize = prompts
        .iter()
        .flat_map(|p| &p.requests)
        .map(|r| r.max_tokens)
        .sum();
    if generated > limits.max_generated_tokens {
        return Err(ApiError::invalid(
            "max_tokens",
            format!(
                "the request may generate {generated} tokens (max_tokens times best_of or n, over every prompt); this server allows at most {} per request",
                limits.max_generated_tokens
            ),
        ));
    }
    Ok(())
}

/// A 400 when one prompt's choices need more KV cache than the engine may ever give
/// (`kv_budget` positions: they would never be admitted), or when the answer could carry
/// more log-probabilities or echoed text than the server's limits allow.
fn check_answer_size(
    params: &GenerateParams,
    prompts: &[PreparedPrompt],
    limits: &RequestLimits,
    kv_budget: usize,
) -> Result<(), ApiError> {
    for p in prompts {
        let one = p
            .requests
            .first()
            .map_or(0, |r| p.prompt_tokens + r.max_tokens);
        let need = one * p.requests.len();
        if need > kv_budget {
            let (param, what) = if one > kv_budget {
                ("max_tokens", "the prompt plus `max_tokens`".to_string())
            } else if params.best_of > params.n {
                ("best_of", format!("{} choices", p.requests.len()))
            } else {
                ("n", format!("{} choices", p.requests.len()))
            };
            return Err(ApiError::invalid(
                param,
                format!(
                    "{what} of {one} tokens each need {need} KV cache positions; this server gives one request at most {kv_budget} (--kv-budget)",
                ),
            ));
        }
    }
    let echo = params.output.echo;
    let mut entries = 0usize;
    if let Some(k) = params.output.logprobs {
        entries = prompts
            .iter()
            .flat_map(|p| p.requests.iter().map(move |r| (p, r)))
            .map(|(p, r)| (if echo { p.prompt_tokens } else { 0 } + r.max_tokens) * (1 + k))
            .sum();
        if entries > limits.max_logprob_entries {
            return Err(ApiError::invalid(
                "logprobs",
                format!(
                    "the answer could carry {entries} log-probabilities ((echoed prompt tokens plus max_tokens) times (1 + logprobs), over every choice); this server allows at most {}",
                    limits.max_logprob_entries
                ),
            ));
        }
    }
    if let Some(k) = params.output.prompt_logprobs {
        // Every returned choice (`n` per prompt) repeats its prompt's scores: the token
        // and k others.
        entries += prompts
            .iter()
            .map(|p| p.prompt_tokens * (2 + k) * params.n)
            .sum::<usize>();
        if entries > limits.max_logprob_entries {
            return Err(ApiError::invalid(
                "prompt_logprobs",
                format!(
                    "the answer could carry {entries} log-probabilities (with prompt_logprobs: prompt tokens times (2 + prompt_logprobs), in every choice); this server allows at most {}",
                    limits.max_logprob_entries
                ),
            ));
        }
    }
    if echo {
        let bytes: usize = prompts
            .iter()
            .map(|p| p.echo.text.len() * p.requests.len())
            .sum();
        if bytes > limits.max_echo_bytes {
            return Err(ApiError::invalid(
                "echo",
                format!(
                    "echoing the prompt in every choice would take {bytes} bytes; this server allows at most {}",
                    limits.max_echo_bytes
                ),
            ));
        }
    }
    Ok(())
}

/// The parts of every sequence's request that do not depend on its prompt.
fn base_request(params: &GenerateParams, tokenizer: &Tokenizer) -> SequenceRequest {
    let mut sampling = params.sampling.clone();
    if let Some(dry) = &mut sampling.dry {
        dry.breakers = breaker_tokens(tokenizer, &params.dry_breakers);
    }
    let mut r = SequenceRequest::new(Vec::new(), sampling, 0);
    r.stop = ferrite_engine::stop::StopStrings::new(params.stop.clone());
    r.include_stop_str_in_output = params.include_stop_str_in_output;
    r.stop_token_ids = params.stop_token_ids.clone();
    r.ignore_eos = params.ignore_eos;
    r.top_logprobs = params.output.logprobs;
    // Ranking best_of choices needs every token's log-probability.
    r.token_logprobs = params.best_of > params.n;
    r.skip_special_tokens = params.output.skip_special_tokens;
    // Prompt logprobs are shown with echo and logprobs, and with vLLM's
    // `prompt_logprobs`; the ranking of best_of needs none. One pass scores both.
    r.prompt_logprobs = match (
        params.output.logprobs.filter(|_| params.output.echo),
        params.output.prompt_logprobs,
    ) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    r.allowed_tokens = params.allowed_token_ids.clone();
    r.prediction = params
        .prediction
        .as_deref()
        .map(|text| tokenizer.encode(text, false))
        .unwrap_or_default();
    r.deadline = params
        .inference_timeout
        .map(|t| Instant::now() + Duration::from_secs_f64(t));
    r
}

/// The tokens whose text contains a DRY sequence breaker.
fn breaker_tokens(tokenizer: &Tokenizer, breakers: &[String]) -> Vec<TokenId> {
    (0..tokenizer.vocab_size() as TokenId)
        .filter(|&id| {
            let text = String::from_utf8_lossy(&tokenizer.token_bytes(id, false)).into_owned();
            breakers.iter().any(|b| text.contains(b.as_str()))
        })
        .collect()
}

/// A default `max_tokens` lowered to this prompt's share of the server's per-request
/// limits (KV cache of `kv_budget` positions, generated tokens, log-probabilities), so
/// that a client that asked for no length is not refused for one. A prompt that leaves no
/// share still gets one token: the limits' own checks then say what is too large.
fn default_within_limits(
    max_tokens: usize,
    prompt_tokens: usize,
    params: &GenerateParams,
    limits: &RequestLimits,
    kv_budget: usize,
) -> usize {
    let choices = params.best_of.max(1);
    let sequences = choices * params.prompts.len().max(1);
    let mut share = max_tokens
        .min((kv_budget / choices).saturating_sub(prompt_tokens))
        .min(limits.max_generated_tokens / sequences);
    if let Some(k) = params.output.logprobs {
        let echoed = if params.output.echo { prompt_tokens } else { 0 };
        share =
            share.min((limits.max_logprob_entries / ((1 + k) * sequences)).saturating_sub(echoed));
    }
    share.max(1)
}

/// Applies the context rules: a prompt that alone fills the context is a 400 unless
/// `truncate_sequence` keeps its end; a completion that would overflow is shortened
/// (`truncate`) or refused (`error`). Returns the prompt and its `max_tokens`.
fn fit_context(
    params: &GenerateParams,
    mut tokens: Vec<TokenId>,
    context: usize,
) -> Result<(Vec<TokenId>, usize), ApiError> {
    if tokens.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    // Without `max_tokens`, the default is lowered to what fits, whatever `overflow` says;
    // a prompt cut to fit keeps room for it, or for half the context at most.
    let reserved = params
        .max_tokens
        .unwrap_or(params.default_max_tokens.min(context / 2));
    if tokens.len() >= context {
        if !params.truncate_sequence {
            return Err(ApiError::ContextLengthExceeded {
                param: "prompt".into(),
                message: format!(
                    "This model's maximum context length is {context} tokens, but the prompt has {} tokens; shorten it or set `truncate_sequence`",
                    tokens.len()
                ),
            });
        }
        let keep = context.saturating_sub(reserved).max(1);
        tokens.drain(..tokens.len() - keep);
    }
    let room = context - tokens.len();
    let Some(wanted) = params.max_tokens else {
        return Ok((tokens, params.default_max_tokens.min(room)));
    };
    if wanted > room && params.overflow == Overflow::Error {
        return Err(ApiError::ContextLengthExceeded {
            param: "max_tokens".into(),
            message: format!(
                "This model's maximum context length is {context} tokens; the prompt has {} tokens and {wanted} more were asked for",
                tokens.len()
            ),
        });
    }
    Ok((tokens, wanted.min(room)))
}

/// A distinct, reproducible seed per choice (SplitMix64 of the request seed and index),
/// so choice 0 of a seeded request is the same whatever `n` is.
fn choice_seed(base: u64, index: usize) -> u64 {
    let mut z = base.wrapping_add((index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::{parse_body, FieldLimits};

    fn params(body: &str) -> GenerateParams {
        GenerateParams::new(
            parse_body(body.as_bytes(), false).unwrap(),
            &FieldLimits::DEFAULT,
        )
        .unwrap()
    }

    #[test]
    fn choice_seeds_differ_and_are_stable() {
        assert_eq!(choice_seed(7, 0), choice_seed(7, 0));
        assert_ne!(choice_seed(7, 0), choice_seed(7, 1));
        assert_ne!(choice_seed(7, 0), choice_seed(8, 0));
    }

    #[test]
    fn requests_over_the_limits_are_refused_naming_the_field() {
        let prompt = |tokens: usize, choices: usize, max_tokens: usize| PreparedPrompt {
            echo: Echo::default(),
            token_ids: None,
            prompt_tokens: tokens,
            requests: (0..choices)
                .map(|_| SequenceRequest::new(vec![1; tokens], Default::default(), max_tokens))
                .collect(),
        };
        let limits = RequestLimits {
            max_body_bytes: 1 << 20,
            max_prompt_tokens: 100,
            max_generated_tokens: 64,
            ..Default::default()
        };
        assert!(check_limits(&[prompt(50, 4, 16), prompt(50, 1, 0)], &limits).is_ok());
        let param = |r: Result<(), ApiError>| match r {
            Err(ApiError::InvalidRequest { param, .. }) => param,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            param(check_limits(&[prompt(60, 1, 1), prompt(41, 1, 1)], &limits)),
            Some("prompt".into())
        );
        assert_eq!(
            param(check_limits(&[prompt(10, 5, 13)], &limits)),
            Some("max_tokens".into())
        );
    }

    #[test]
    fn context_rules() {
        let truncate = params(r#"{"model":"m","prompt":"x","max_tokens":50}"#);
        let (t, max) = fit_context(&truncate, vec![1; 90], 100).unwrap();
        assert_eq!((t.len(), max), (90, 10), "truncate lowers max_tokens");
        let error = params(
            r#"{"model":"m","prompt":"x","max_tokens":50,"context_length_exceeded_behavior":"error"}"#,
        );
        let err = fit_context(&error, vec![1; 90], 100).unwrap_err();
        assert!(
            matches!(&err, ApiError::ContextLengthExceeded { param, .. } if param == "max_tokens")
        );
        assert_eq!(
            err.body().error.code.as_deref(),
            Some("context_length_exceeded")
        );
        let err = fit_context(&truncate, vec![1; 100], 100).unwrap_err();
        assert!(matches!(&err, ApiError::ContextLengthExceeded { param, .. } if param == "prompt"));
        let keep_end =
            params(r#"{"model":"m","prompt":"x","max_tokens":10,"truncate_sequence":true}"#);
        let long: Vec<u32> = (0..150).collect();
        let (t, max) = fit_context(&keep_end, long, 100).unwrap();
        assert_eq!(
            (t.len(), max, t[0]),
            (90, 10, 60),
            "the end of the prompt is kept"
        );
        // Without max_tokens: the default (16 for a completion, more for chat), lowered to
        // fit whatever `overflow` says.
        let mut default =
            params(r#"{"model":"m","prompt":"x","context_length_exceeded_behavior":"error"}"#);
        assert_eq!(fit_context(&default, vec![1; 10], 100).unwrap().1, 16);
        assert_eq!(fit_context(&default, vec![1; 90], 100).unwrap().1, 10);
        default.default_max_tokens = 4096;
        assert_eq!(fit_context(&default, vec![1; 10], 100).unwrap().1, 90);
        default.truncate_sequence = true;
        let (t, max) = fit_context(&default, vec![1; 150], 100).unwrap();
        assert_eq!(
            (t.len(), max),
            (50, 50),
            "a cut prompt leaves half the context"
        );
    }
}
