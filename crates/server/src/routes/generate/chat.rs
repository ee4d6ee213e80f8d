//! `POST /v1/chat/completions`: the request validated as a completion with messages, the
//! messages rendered by the model's chat template into the prompt, then the shared
//! pipeline, answering in the chat shape.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::Response;
use ferrite_chat::tools::{ToolSyntax, HERMES_CLOSE, HERMES_OPEN};
use ferrite_engine::constrain::{Grammar, GrammarKind};
use ferrite_engine::tokenizer::{TokenKind, Tokenizer};
use serde_json::json;

use super::reply::{Dialect, ToolOutput};
use super::run;
use crate::error::ApiError;
use crate::routes::body::RawBody;
use crate::state::AppState;
use crate::validate::{
    any_call_schema, parse_chat_body, tool_schema, ChatParams, ImageMarker, OutputConstraint,
    ToolChoice, ToolDefinition,
};

/// Whether `piece` is one control token of the vocabulary.
fn is_control_token(tokenizer: &Tokenizer, piece: &str) -> bool {
    tokenizer
        .piece_id(piece)
        .is_some_and(|id| tokenizer.kind(id) == Some(TokenKind::Control))
}

/// Handles `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let engine = state.engine()?.clone();
    let setup = Arc::clone(state.chat()?);
    let ChatParams {
        mut generate,
        mut input,
        tool_choice,
        tools,
        parallel_tool_calls,
    } = parse_chat_body(&body, state.ignore_unknown_fields, &state.limits.fields)?;
    let output = match tool_choice {
        ToolChoice::None => ToolOutput::None,
        ToolChoice::Auto if tools.is_empty() => ToolOutput::None,
        ToolChoice::Auto => {
            let syntax = setup.tools.syntax;
            if generate.constraint.is_none() && syntax == ToolSyntax::Hermes {
                generate.constraint =
                    hermes_calls_grammar(&tools, parallel_tool_calls, engine.tokenizer());
            }
            // A marker that is a control token (Mistral's `[TOOL_CALLS]`) would be left
            // out of the text, and the call with it.
            if is_control_token(engine.tokenizer(), syntax.marker()) {
                generate.output.skip_special_tokens = false;
            }
            ToolOutput::Parse {
                syntax,
                parallel: parallel_tool_calls,
            }
        }
        ToolChoice::Required => ToolOutput::Calls {
            parallel: parallel_tool_calls,
        },
        ToolChoice::Named(name) => ToolOutput::Arguments(name),
    };
    generate.default_max_tokens = state.limits.chat_max_tokens;
    if let Some(end) = setup.end_of_turn {
        if !generate.stop.iter().any(|s| s == end) {
            generate.stop.push(end.to_string());
        }
    }
    // Rendering runs the template's code: off the async workers (its fuel bounds it), and
    // over long messages a few at a time (the turn ends before the prompt's own).
    let tokenizer = Arc::clone(engine.tokenizer());
    generate.images = std::mem::take(&mut input.images);
    generate.image_marker = ImageMarker::Chat;
    let prompt = {
        let _turn = state.heavy_turn(body.len(), false).await?;
        tokio::task::spawn_blocking(move || setup.render(&input, &tokenizer))
            .await
            .map_err(|_| ApiError::Internal)??
    };
    generate.prompts = vec![prompt];
    run(
        &state,
        engine,
        generate,
        arrived,
        Dialect::Chat(output),
        "chatcmpl",
    )
    .await
    .map_err(|e| {
        e.with_param_renamed("prompt", "messages")
            .with_param_renamed("images", "messages")
    })
}

/// With `tool_choice: auto` in the Hermes syntax, the output is free until the model
/// opens a call; from `<tool_call>` on it must be a valid call of one of the tools and
/// its closing tag (llama.cpp's "lazy grammar"). So a call the model starts always
/// parses, and text without one is untouched (it just cannot contain the opening tag
/// outside a call). `None` where the vocabulary has `<tool_call>` as one special token,
/// which text cannot spell: the output is then parsed as it comes, unconstrained.
fn hermes_calls_grammar(
    tools: &[ToolDefinition],
    parallel: bool,
    tokenizer: &Tokenizer,
) -> Option<OutputConstraint> {
    let special = tokenizer.piece_id(HERMES_OPEN).is_some_and(|id| {
        matches!(
            tokenizer.kind(id),
            Some(TokenKind::Control | TokenKind::UserDefined)
        )
    });
    if special {
        return None;
    }
    let chosen: Vec<&ToolDefinition> = tools.iter().collect();
    // Tools whose definitions clash are left unconstrained here: `auto` asks for no
    // constraint, only for calls that parse.
    let schema = tool_schema(any_call_schema(&chosen), &chosen).ok()?;
    let calls = if parallel { "*" } else { "?" };
    let source = format!(
        "start: (before_call call){calls} after\n\
         before_call[lazy]: /(?s:.*){open}/\n\
         call: /[ \\n]*/ %json{schema} /[ \\n]*/ {close}\n\
         after: AFTER\n\
         AFTER: /(?s:.*)/ & ~/(?s:.*){open}(?s:.*)/\n",
        open = regex_syntax::escape(HERMES_OPEN),
        close = json!(HERMES_CLOSE),
    );
    Some(OutputConstraint {
        field: "tools",
        grammar: Grammar {
            kind: GrammarKind::Lark,
            source,
        },
        // A tool schema llguidance cannot take leaves the output free: the request asked
        // for no constraint.
        best_effort: true,
    })
}
