//! `POST /tokenize`, `POST /detokenize` and `GET /tokenizer_info`, in vLLM's shapes:
//! with them, a client such as lm-evaluation-harness tokenizes through the server
//! instead of downloading the model's tokenizer.

use std::sync::Arc;

use crate::routes::body::RawBody;
use crate::routes::cancel::CancelOnDrop;
use axum::extract::State;
use axum::Json;
use ferrite_engine::tokenizer::{TokenKind, Tokenizer};
use ferrite_protocol::{DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse};
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::routes::generate::{encode_with_images, fetch_images};
use crate::state::AppState;
use crate::validate::{deserialize_body, tool_definitions, ChatInput, ImageMarker, PromptInput};
use ferrite_engine::vision::prompt::is_image_token;

/// Tokenizes text as a prompt would be (or without special tokens).
pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let engine = state.engine()?.clone();
    let request: TokenizeRequest = deserialize_body(&body)?;
    if let Some(model) = &request.model {
        state.check_model(model)?;
    }
    let tokenizer = Arc::clone(engine.tokenizer());
    let special = request.add_special_tokens.unwrap_or(true);
    let with_strs = request.return_token_strs.unwrap_or(false);
    let mut images = Vec::new();
    let text = match (request.prompt, request.messages) {
        (Some(prompt), None) => {
            for (field, given) in [
                (
                    "add_generation_prompt",
                    request.add_generation_prompt.is_some(),
                ),
                (
                    "continue_final_message",
                    request.continue_final_message.is_some(),
                ),
                (
                    "chat_template_kwargs",
                    request.chat_template_kwargs.is_some(),
                ),
                ("tools", request.tools.is_some()),
            ] {
                if given {
                    return Err(ApiError::invalid(
                        field,
                        format!("`{field}` goes with `messages`"),
                    ));
                }
            }
            PromptInput::Text(prompt)
        }
        (None, Some(messages)) => {
            // The chat route's prompt: the same checks, the same template.
            let setup = Arc::clone(state.chat()?);
            let mut input = ChatInput::new(
                Value::Array(messages),
                request.add_generation_prompt,
                request.continue_final_message,
                request.chat_template_kwargs.unwrap_or_default(),
            )?;
            let tools = request.tools.unwrap_or_default();
            tool_definitions(&tools, state.limits.fields.max_tool_name_bytes)?;
            input.tools = tools;
            images = std::mem::take(&mut input.images);
            let tokenizer = Arc::clone(&tokenizer);
            let _turn = state.heavy_turn(body.len(), false).await?;
            tokio::task::spawn_blocking(move || setup.render(&input, &tokenizer))
                .await
                .map_err(|_| ApiError::Internal)??
        }
        _ => {
            return Err(ApiError::invalid_body(
                "give one of `prompt` (text) or `messages` (a conversation)",
            ))
        }
    };
    // A client that leaves stops the fetching of its images and the tokenization of a
    // long prompt.
    let (_guard, cancelled) = CancelOnDrop::new();
    // Counted (and fetched) as the chat route does.
    fetch_images(&state, &engine, &mut images, "messages", &cancelled).await?;
    // Long texts tokenize a few at a time (see `AppState::heavy_turn`).
    let _turn = state.heavy_turn(text.text_bytes(), false).await?;
    let engine_for_images = engine.clone();
    let limits = state.limits;
    let (tokens, strs) = tokio::task::spawn_blocking(move || {
        // Special tokens written in the text are their ids either way, as in a Hugging
        // Face tokenizer (vLLM's): `add_special_tokens` only says whether BOS is added. So
        // lm-evaluation-harness finds the EOS id by tokenizing `eos_token`.
        let tokens = match (&text, special) {
            // As the chat route builds the prompt: each image's positions counted.
            _ if !images.is_empty() => encode_with_images(
                &engine_for_images,
                &limits,
                &text,
                &images,
                ImageMarker::Chat,
                &cancelled,
            )
            .map(|(tokens, _)| tokens)
            .map_err(|e| e.with_param_renamed("images", "messages"))?,
            (PromptInput::Rendered(text), _) => {
                tokenizer.encode_rendered_until(text, special, &cancelled)?
            }
            (PromptInput::Text(text), true) => tokenizer.encode_prompt_until(text, &cancelled)?,
            (PromptInput::Text(text), false) => tokenizer.encode_until(text, true, &cancelled)?,
            (PromptInput::Tokens(ids), _) => ids.clone(),
        };
        // The vocabulary's own strings, as a Hugging Face tokenizer's
        // `convert_ids_to_tokens` gives them (vLLM's `token_strs`), not decoded text; an
        // image's positions `<image>`.
        let strs = with_strs.then(|| {
            tokens
                .iter()
                .map(|&t| match is_image_token(t) {
                    true => "<image>".to_string(),
                    false => tokenizer.piece(t).unwrap_or_default().to_string(),
                })
                .collect()
        });
        Ok::<_, ApiError>((tokens, strs))
    })
    .await
    .map_err(|_| ApiError::Internal)??;
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: engine.context_length(),
        tokens,
        token_strs: strs,
    }))
}

/// Turns token ids back into text (special tokens included).
pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let engine = state.engine()?.clone();
    let request: DetokenizeRequest = deserialize_body(&body)?;
    if let Some(model) = &request.model {
        state.check_model(model)?;
    }
    let vocab = engine.tokenizer().vocab_size();
    if let Some(bad) = request.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {bad} is out of the vocabulary (0..{vocab})"),
        ));
    }
    Ok(Json(DetokenizeResponse {
        prompt: engine.tokenizer().decode(&request.tokens, true),
    }))
}

/// `GET /tokenizer_info`: what a Hugging Face tokenizer's configuration would say, in
/// vLLM's shape: the special tokens' text (`bos_token`, `eos_token`, `unk_token`,
/// `pad_token`), whether prompts start with BOS, the context length, the chat template
/// the chat route renders with (`--chat-template`'s, the model's, or the ChatML default),
/// and `added_tokens_decoder` (id → Hugging Face's `AddedToken` object of every special
/// and user-defined token: `content`, `special`, `lstrip`, `rstrip`, `normalized`,
/// `single_word`).
pub async fn tokenizer_info(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let engine = state.engine()?;
    Ok(Json(describe(
        engine.tokenizer(),
        engine.context_length(),
        state.model_name(),
        &state.chat()?.source,
    )))
}

fn describe(tokenizer: &Tokenizer, context: usize, name: &str, chat_template: &str) -> Value {
    let text = |id: Option<u32>| id.and_then(|id| tokenizer.piece(id)).map(str::to_string);
    let mut added = Map::new();
    for id in 0..tokenizer.vocab_size() as u32 {
        // Hugging Face's `AddedToken` as its `tokenizer_config.json` writes it: control
        // and unknown tokens are special and match the text as written; user-defined ones
        // are plain added words, normalized like the rest of the text.
        let special = match tokenizer.kind(id) {
            Some(TokenKind::Control | TokenKind::Unknown) => true,
            Some(TokenKind::UserDefined) => false,
            _ => continue,
        };
        added.insert(
            id.to_string(),
            json!({
                "content": tokenizer.piece(id),
                "special": special,
                "lstrip": false,
                "rstrip": false,
                "normalized": !special,
                "single_word": false,
            }),
        );
    }
    json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "name_or_path": name,
        "bos_token": text(tokenizer.bos()),
        "eos_token": text(tokenizer.eos()),
        "unk_token": text(tokenizer.unknown()),
        "pad_token": text(tokenizer.padding()),
        "add_bos_token": tokenizer.adds_bos(),
        "add_eos_token": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": context,
        "chat_template": chat_template,
        "added_tokens_decoder": added,
    })
}
