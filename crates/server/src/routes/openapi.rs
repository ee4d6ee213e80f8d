//! `GET /openapi.json`: an OpenAPI 3.1 description of every route, its bodies and the
//! error shape. The request schema of `POST /v1/completions` lists every field the parser
//! accepts (a test keeps the two equal), each with the rule `docs/API.md` gives it (the
//! document links to that reference).

use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Map, Value};

/// `GET /openapi.json`.
pub async fn openapi() -> Json<Value> {
    Json(document())
}

/// The API reference, `docs/API.md`, built into the binary so that the document's link
/// works wherever the server runs.
pub const API_REFERENCE: &str = include_str!("../../../../docs/API.md");

/// `GET /docs/API.md`.
pub async fn api_reference() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")],
        API_REFERENCE,
    )
}

/// Every request field of `POST /v1/completions`: its schema and what it does.
fn completion_fields() -> Vec<(&'static str, Value)> {
    let int = |description: &str| json!({"type": "integer", "description": description});
    let number = |description: &str| json!({"type": "number", "description": description});
    let boolean = |description: &str| json!({"type": "boolean", "description": description});
    let string = |description: &str| json!({"type": "string", "description": description});
    let any = |description: &str| json!({"description": description});
    let object = |description: &str| json!({"type": "object", "description": description});
    let list = |item: &str, description: &str| json!({"type": "array", "items": {"type": item}, "description": description});
    let strings = json!({"type": "array", "items": {"type": "string"}});
    let ints = json!({"type": "array", "items": {"type": "integer"}});
    vec![
        ("model", string("A served name, an alias from --served-model-name, `default`, or `vendor/…/name` whose last segment is one.")),
        ("prompt", json!({"description": "Text, texts, token ids or lists of token ids; each prompt gets `n` choices, index = prompt × n + j.",
            "oneOf": [{"type": "string"}, strings, ints, {"type": "array", "items": ints}]})),
        ("suffix", string("Fill-in-the-middle when the model has FIM tokens; otherwise appended to each choice's text.")),
        ("max_tokens", int("Most tokens per choice (default 16); 0 only with `echo`, to score the prompt.")),
        ("max_completion_tokens", int("Alias of `max_tokens`; aliases that disagree are a 400.")),
        ("max_new_tokens", int("Alias of `max_tokens`; aliases that disagree are a 400.")),
        ("context_length_exceeded_behavior", json!({"type": "string", "enum": ["truncate", "error"],
            "description": "`truncate` (default) lowers max_tokens to fit the context; `error` answers 400."})),
        ("truncate_sequence", boolean("A prompt that alone fills the context keeps its last ctx − max_tokens tokens instead of a 400.")),
        ("temperature", number("0..2 (default 1); 0 is greedy.")),
        ("top_p", number("Nucleus mass, (0, 1] (default 1).")),
        ("top_k", int("Keep the k most likely tokens; 0 or -1 is off.")),
        ("min_p", number("Drop tokens below min_p × the top probability, [0, 1].")),
        ("typical_p", number("Locally typical sampling mass, (0, 1].")),
        ("frequency_penalty", number("-2..2, OpenAI's formula over generated tokens.")),
        ("presence_penalty", number("-2..2, OpenAI's formula over generated tokens.")),
        ("repetition_penalty", number("(0, 2], multiplicative, over prompt and output tokens.")),
        ("logit_bias", json!({"type": "object", "additionalProperties": {"type": "number"},
            "description": "Token id → bias in -100..100, added to the logits."})),
        ("seed", int("Same seed and request: the same output, whatever else runs.")),
        ("n", int("Choices per prompt, 1..128.")),
        ("best_of", int("Generate best_of (n..20) and return the n with the highest mean token logprob; not with `stream`.")),
        ("stop", json!({"description": "Up to 4 strings that end a choice, matched on text across tokens.",
            "oneOf": [{"type": "string"}, strings]})),
        ("stop_sequences", any("Alias of `stop`.")),
        ("include_stop_str_in_output", boolean("Keep the matched stop string in `text`.")),
        ("stop_token_ids", list("integer", "Extra token ids that end a choice.")),
        ("ignore_eos", boolean("Keep generating past end-of-sequence tokens.")),
        ("min_tokens", int("End-of-sequence tokens and stops are suppressed before this many tokens.")),
        ("echo", boolean("Prepend the prompt to `text` (with `logprobs`, score its tokens too).")),
        ("logprobs", json!({"description": "An integer 0..20: the legacy logprobs with that many alternatives; or `true` with `top_logprobs`.",
            "oneOf": [{"type": "integer"}, {"type": "boolean"}]})),
        ("top_logprobs", int("Alternatives per token, 0..20, with `logprobs: true`.")),
        ("return_token_log_probs", boolean("The same as `logprobs: 0`.")),
        ("return_tokens_as_token_ids", boolean("Write tokens in logprobs as `token_id:<id>`.")),
        ("prompt_logprobs", int("vLLM: 0..20; each choice carries `prompt_logprobs`, null for the first prompt token, then \
            token id → {logprob, rank, decoded_token} for the prompt's token and this many likely ones. Not with `stream`.")),
        ("allowed_token_ids", list("integer", "vLLM: only these token ids may be generated (non-empty, in the vocabulary).")),
        ("return_token_ids", boolean("vLLM: choices carry `prompt_token_ids` and `token_ids` (a stream's first chunk of a choice \
            carries `prompt_token_ids`, every chunk the `token_ids` of its text).")),
        ("skip_special_tokens", boolean("Leave special tokens out of `text`, the echoed prompt's included (default true).")),
        ("mirostat_target", number("Turns Mirostat 2.0 on with this target surprise (tau).")),
        ("mirostat_lr", number("Mirostat's learning rate (eta), default 0.1.")),
        ("dry_multiplier", number("DRY repetition penalty strength; 0 (default) is off.")),
        ("dry_base", number("DRY's base, default 1.75.")),
        ("dry_allowed_length", int("DRY's allowed repeat length, default 2.")),
        ("dry_sequence_breakers", list("string", "Strings that break DRY's sequences.")),
        ("response_format", object(
            "`{\"type\":\"json_object\"}` (optionally with `schema`), \
             `{\"type\":\"json_schema\",\"json_schema\":{…}}` or `{\"type\":\"grammar\",\"grammar\":\"…\"}`.",
        )),
        ("guided_json", any("A JSON schema (object or string) the output follows.")),
        ("guided_regex", string("A regular expression the output matches.")),
        ("guided_choice", list("string", "The output is exactly one of these.")),
        ("guided_grammar", string("A Lark-style grammar (llguidance dialect) the output follows.")),
        ("grammar", object("`{\"type\": \"regex\"|\"json_schema\"|\"lark\"|\"llguidance\", \"value\": …}`.")),
        ("tools", list(
            "object",
            "Functions; with `tool_choice` required or named, the output is a JSON call valid for the tool's schema.",
        )),
        ("tool_choice", any("`auto`, `none`, `required` or a named function.")),
        ("parallel_tool_calls", boolean("Accepted.")),
        ("images", list("string", "Data URIs; a text-only model answers 400.")),
        ("stream", boolean("Server-sent events, ending with `data: [DONE]`.")),
        ("stream_options", json!({"type": "object", "description": "Only with `stream`. `include_usage` adds a last chunk with \
            the usage; `continuous_usage_stats` (with `include_usage`) puts the running usage on every chunk.",
            "properties": {"include_usage": {"type": "boolean"}, "continuous_usage_stats": {"type": "boolean"}}})),
        ("inference_timeout", number(
            "Seconds the request may run; past it a 504 (or an error event on a stream). \
             The server's --request-timeout caps it.",
        )),
        ("prediction", object("`{\"type\":\"content\",\"content\":\"…\"}`: expected output, verified as draft tokens.")),
        ("modalities", list("string", "Only `[\"text\"]`.")),
        ("audio", any("Not supported: any value is a 400.")),
        ("user", string("Logged.")),
        ("inference_extra_params", any("Accepted and ignored.")),
        ("inference_extra_headers", any("Accepted and ignored.")),
        ("metadata", any("Accepted and ignored.")),
        ("priority", any("Accepted and ignored.")),
    ]
}

/// Every request field of `POST /v1/chat/completions`: the completion fields that make
/// sense for chat (some described anew) and chat's own.
fn chat_fields() -> Vec<(&'static str, Value)> {
    let chat_only = [
        (
            "messages",
            json!({"type": "array", "items": {"type": "object", "required": ["role"], "properties": {
            "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
            "content": {"description": "Text, or text parts `{\"type\":\"text\",\"text\":…}` (joined by newlines); null for an assistant message with tool calls. Image and audio parts are a 400.",
                "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}, {"type": "null"}]},
            "name": {"type": "string"}, "tool_calls": {"type": "array", "items": {"type": "object"}},
            "tool_call_id": {"type": "string", "description": "Required on a tool message."}}},
            "description": "The conversation, rendered by the model's chat template (or --chat-template's) into the prompt."}),
        ),
        (
            "add_generation_prompt",
            json!({"type": "boolean", "description": "vLLM: end the prompt with the start of the assistant's turn (default true)."}),
        ),
        (
            "continue_final_message",
            json!({"type": "boolean", "description": "vLLM: leave the last (assistant) message open and continue it."}),
        ),
        (
            "chat_template_kwargs",
            json!({"type": "object", "description": "vLLM: more variables for the template (e.g. `enable_thinking`)."}),
        ),
        (
            "store",
            json!({"type": "boolean", "description": "OpenAI: accepted; this server stores nothing either way."}),
        ),
        (
            "service_tier",
            json!({"enum": ["auto", "default"], "description": "OpenAI: this server has one tier; `auto` and `default` are accepted."}),
        ),
    ];
    let described_anew = [
        (
            "max_tokens",
            json!({"type": "integer", "description": "Most tokens per choice (default: the rest of the context)."}),
        ),
        (
            "logprobs",
            json!({"type": "boolean", "description": "Each choice carries `logprobs.content`: per generated token its text, logprob, bytes and `top_logprobs`."}),
        ),
        (
            "tools",
            json!({"type": "array", "items": {"type": "object"}, "description": "Functions the model may call; the template describes them (or, for a template without tools, a system message in the Hermes syntax)."}),
        ),
        (
            "tool_choice",
            json!({"description": "`none`, `auto` (default with tools: calls in the model's syntax are parsed into `tool_calls`), `required` (the output is one or more calls) or a named function (a call of it)."}),
        ),
        (
            "parallel_tool_calls",
            json!({"type": "boolean", "description": "Several calls in one answer (default true); false allows one."}),
        ),
    ];
    let not_for_chat: Vec<&str> = ferrite_protocol::NOT_FOR_CHAT
        .iter()
        .map(|(f, _)| *f)
        .collect();
    let mut fields: Vec<(&'static str, Value)> = completion_fields()
        .into_iter()
        .filter(|(name, _)| !not_for_chat.contains(name))
        .map(|(name, schema)| {
            let anew = described_anew.iter().find(|(n, _)| *n == name);
            (name, anew.map_or(schema, |(_, s)| s.clone()))
        })
        .collect();
    fields.extend(chat_only);
    fields
}

/// The whole document.
pub fn document() -> Value {
    let properties: Map<String, Value> = completion_fields()
        .into_iter()
        .map(|(name, schema)| (name.to_string(), schema))
        .collect();
    let chat_properties: Map<String, Value> = chat_fields()
        .into_iter()
        .map(|(name, schema)| (name.to_string(), schema))
        .collect();
    let usage = json!({"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"], "properties": {
        "prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"},
        "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": {"type": "integer",
            "description": "Prompt tokens the prefix cache served."}}}}});
    let ids = json!({"type": "array", "items": {"type": "integer"}});
    // vLLM's keys of a non-streaming answer: always there, `null` unless asked for.
    let ids_or_null = json!({"type": ["array", "null"], "items": {"type": "integer"}});
    let prompt_logprobs = json!({"type": ["array", "null"], "items": {"type": ["object", "null"]}});
    let choice = json!({"type": "object", "required": ["index", "text", "logprobs", "finish_reason"], "properties": {
        "index": {"type": "integer"}, "text": {"type": "string"},
        "logprobs": {"type": ["object", "null"]},
        "finish_reason": {"type": ["string", "null"], "enum": ["stop", "length", null]},
        "stop_reason": {"description": "The stop string or token id that ended the choice (vLLM)."},
        "prompt_logprobs": prompt_logprobs, "prompt_token_ids": ids_or_null, "token_ids": ids_or_null}});
    let completion = |choice: Value, usage: Value| {
        json!({"type": "object", "required": ["id", "object", "created", "model", "choices"], "properties": {
        "id": {"type": "string"}, "object": {"const": "text_completion"}, "created": {"type": "integer"},
        "model": {"type": "string"}, "system_fingerprint": {"type": "string"},
        "choices": {"type": "array", "items": choice}, "usage": usage}})
    };
    let tool_calls = json!({"type": "array", "items": {"type": "object", "properties": {
        "index": {"type": "integer", "description": "In a stream's delta."},
        "id": {"type": "string"}, "type": {"const": "function"},
        "function": {"type": "object", "properties": {"name": {"type": "string"},
            "arguments": {"type": "string", "description": "JSON text"}}}}}});
    let chat_logprobs = json!({"type": ["object", "null"], "properties": {"content": {"type": "array", "items": {"type": "object",
        "properties": {"token": {"type": "string"}, "logprob": {"type": "number"}, "bytes": ids,
            "top_logprobs": {"type": "array", "items": {"type": "object"}}}}}}});
    let finish =
        json!({"type": ["string", "null"], "enum": ["stop", "length", "tool_calls", null]});
    let chat_choice = json!({"type": "object", "required": ["index", "message", "logprobs", "finish_reason"], "properties": {
        "index": {"type": "integer"},
        "message": {"type": "object", "properties": {"role": {"const": "assistant"},
            "content": {"type": ["string", "null"]}, "tool_calls": tool_calls}},
        "logprobs": chat_logprobs, "finish_reason": finish, "stop_reason": {}, "token_ids": ids_or_null}});
    let chat_chunk_choice = json!({"type": "object", "required": ["index", "delta", "finish_reason"], "properties": {
        "index": {"type": "integer"},
        "delta": {"type": "object", "description": "The first carries `role`; then `content` or `tool_calls` (each call whole, in one delta); the last is empty, with `finish_reason`.",
            "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}, "tool_calls": tool_calls}},
        "logprobs": chat_logprobs, "finish_reason": finish, "stop_reason": {}, "token_ids": ids}});
    let chat = |object: &str, choice: Value, usage: Value| {
        json!({"type": "object", "required": ["id", "object", "created", "model", "choices"], "properties": {
        "id": {"type": "string"}, "object": {"const": object}, "created": {"type": "integer"},
        "model": {"type": "string"}, "system_fingerprint": {"type": "string"},
        "choices": {"type": "array", "items": choice}, "usage": usage,
        "prompt_token_ids": ids_or_null, "prompt_logprobs": prompt_logprobs}})
    };
    let error = json!({"type": "object", "required": ["error"], "properties": {"error": {"type": "object",
        "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
        "code": {"type": ["string", "null"]}}}}});
    let errors = |codes: &[&str]| -> Value {
        codes
            .iter()
            .map(|code| {
                let schema = json!({"$ref": "#/components/schemas/Error"});
                let answer = json!({"description": error_meaning(code),
                    "content": {"application/json": {"schema": schema}}});
                (code.to_string(), answer)
            })
            .collect::<Map<String, Value>>()
            .into()
    };
    let json_body = |schema: Value| json!({"required": true, "content": {"application/json": {"schema": schema}}});
    let ok = |description: &str, schema: Value| json!({"description": description, "content": {"application/json": {"schema": schema}}});
    let with = |mut responses: Value, extra: Value| {
        if let (Some(map), Value::Object(extra)) = (responses.as_object_mut(), extra) {
            map.extend(extra);
        }
        responses
    };
    let api_errors = ["400", "401", "413", "503"];
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "ferrite",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "An OpenAI-compatible completion server for GGUF models. With API keys \
                configured, every route but /health, /ready and /metrics needs \
                `Authorization: Bearer KEY` or `x-api-key: KEY`. Every response carries `x-request-id`. \
                Every field, rule and error is described in the repository's docs/API.md."
        },
        "externalDocs": {
            "description": "The API reference: every route, field, rule and error (the repository's docs/API.md, served by this server)",
            "url": "/docs/API.md"
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}
            },
            "schemas": {
                "CompletionRequest": {"type": "object", "required": ["model", "prompt"], "additionalProperties": false, "properties": properties},
                "Completion": with_required(completion(choice.clone(), usage.clone()), "usage"),
                "CompletionChunk": completion(choice, json!({"oneOf": [usage.clone(), {"type": "null"}]})),
                "ChatCompletionRequest": {"type": "object", "required": ["model", "messages"], "additionalProperties": false, "properties": chat_properties},
                "ChatCompletion": with_required(chat("chat.completion", chat_choice, usage.clone()), "usage"),
                "ChatCompletionChunk": chat("chat.completion.chunk", chat_chunk_choice, json!({"oneOf": [usage, {"type": "null"}]})),
                "Error": error
            }
        },
        "security": [{"bearer": []}, {"apiKey": []}],
        "paths": {
            "/v1/completions": {"post": {
                "summary": "Complete prompts",
                "requestBody": json_body(json!({"$ref": "#/components/schemas/CompletionRequest"})),
                "responses": with(errors(&["400", "401", "404", "413", "415", "429", "500", "503", "504"]), json!({"200": {
                    "description": "The completion; with `stream`, server-sent events of CompletionChunk ending with `data: [DONE]`.",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Completion"}},
                        "text/event-stream": {"schema": {"$ref": "#/components/schemas/CompletionChunk"}}
                    }}}))
            }},
            "/v1/chat/completions": {"post": {
                "summary": "Answer a conversation, rendered with the model's chat template",
                "requestBody": json_body(json!({"$ref": "#/components/schemas/ChatCompletionRequest"})),
                "responses": with(errors(&["400", "401", "404", "413", "415", "429", "500", "503", "504"]), json!({"200": {
                    "description": "The answer; with `stream`, server-sent events of ChatCompletionChunk ending with `data: [DONE]`.",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletion"}},
                        "text/event-stream": {"schema": {"$ref": "#/components/schemas/ChatCompletionChunk"}}
                    }}}))
            }},
            "/v1/models": {"get": {"summary": "The served model",
                "responses": with(errors(&["401"]), json!({"200": ok("The model list", json!({"type": "object"}))}))}},
            "/v1/models/{id}": {"get": {"summary": "One served model",
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": with(errors(&["401", "404"]), json!({"200": ok("The model, with `max_model_len`", json!({"type": "object"}))}))}},
            "/tokenize": {"post": {"summary": "Tokenize text, or a conversation as the chat route's prompt (vLLM's shape)",
                "requestBody": json_body(json!({"type": "object", "properties": {
                    "model": {"type": "string"}, "prompt": {"type": "string", "description": "This or `messages`."},
                    "messages": {"type": "array", "items": {"type": "object"}, "description": "A conversation, as in a chat request."},
                    "add_generation_prompt": {"type": "boolean"}, "continue_final_message": {"type": "boolean"},
                    "chat_template_kwargs": {"type": "object"}, "tools": {"type": "array", "items": {"type": "object"}},
                    "add_special_tokens": {"type": "boolean"}, "return_token_strs": {"type": "boolean"}}})),
                "responses": with(errors(&api_errors), json!({"200": ok("The tokens", json!({"type": "object", "properties": {
                    "count": {"type": "integer"}, "max_model_len": {"type": "integer"},
                    "tokens": {"type": "array", "items": {"type": "integer"}},
                    "token_strs": {"type": ["array", "null"], "items": {"type": "string"},
                        "description": "The vocabulary's own strings with return_token_strs, else null"}}}))}))}},
            "/tokenizer_info": {"get": {"summary": "The tokenizer's configuration (vLLM's shape): special tokens, add_bos_token, model_max_length, chat_template, added_tokens_decoder",
                "responses": with(errors(&["401", "503"]), json!({"200": ok("The configuration", json!({"type": "object", "properties": {
                    "tokenizer_class": {"type": "string"}, "bos_token": {"type": ["string", "null"]},
                    "eos_token": {"type": ["string", "null"]}, "model_max_length": {"type": "integer"},
                    "chat_template": {"type": ["string", "null"]}, "added_tokens_decoder": {"type": "object",
                        "description": "Token id -> Hugging Face's AddedToken",
                        "additionalProperties": {"type": "object", "required": ["content", "special"], "properties": {
                            "content": {"type": "string"}, "special": {"type": "boolean"}, "lstrip": {"type": "boolean"},
                            "rstrip": {"type": "boolean"}, "normalized": {"type": "boolean"}, "single_word": {"type": "boolean"}}}}}}))}))}},
            "/detokenize": {"post": {"summary": "Detokenize token ids (vLLM's shape)",
                "requestBody": json_body(json!({"type": "object", "required": ["tokens"], "properties": {
                    "model": {"type": "string"}, "tokens": {"type": "array", "items": {"type": "integer"}}}})),
                "responses": with(errors(&api_errors), json!({"200": ok("The text",
                    json!({"type": "object", "properties": {"prompt": {"type": "string"}}}))}))}},
            "/health": {"get": {"summary": "200 while the process serves", "security": [],
                "responses": {"200": {"description": "Alive"}}}},
            "/ready": {"get": {"summary": "200 once the model is loaded and warmed up; 503 before and while shutting down", "security": [],
                "responses": with(errors(&["503"]), json!({"200": {"description": "Ready"}}))}},
            "/metrics": {"get": {"summary": "Prometheus metrics (on --metrics-port when set)", "security": [],
                "responses": {"200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/docs/API.md": {"get": {"summary": "The API reference (Markdown)",
                "responses": with(errors(&["401"]), json!({"200": {"description": "docs/API.md", "content": {"text/markdown": {"schema": {"type": "string"}}}}}))}},
            "/openapi.json": {"get": {"summary": "This document", "responses": with(errors(&["401"]), json!({"200": {"description": "OpenAPI 3.1"}}))}}
        }
    })
}

/// `schema` with `field` required too.
fn with_required(mut schema: Value, field: &str) -> Value {
    if let Some(required) = schema["required"].as_array_mut() {
        required.push(json!(field));
    }
    schema
}

/// What an error status means on this server.
fn error_meaning(code: &str) -> &'static str {
    match code {
        "400" => "invalid_request_error: bad JSON, a wrong type, a value out of range, an unknown or conflicting field; \
            code context_length_exceeded when the prompt (or prompt plus max_tokens) does not fit the context",
        "401" => "authentication_error: a missing or wrong API key",
        "404" => "invalid_request_error (model_not_found): the model is not served",
        "413" => "invalid_request_error: the body is over --max-body-size",
        "415" => "invalid_request_error (unsupported_media_type): the body's Content-Type is not JSON",
        "500" => "server_error: a bug; the message says nothing internal",
        "429" => "rate_limit_error (server_overloaded): the waiting queue is full; see Retry-After",
        "503" => "server_error: the model is still loading (every model route, with Retry-After), the server is shutting down, or too many connections",
        "504" => "timeout_error: inference_timeout or --request-timeout passed; x-should-retry: false",
        _ => "an error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_protocol::KNOWN_FIELDS;

    #[test]
    fn the_request_schema_lists_exactly_the_fields_the_parser_knows() {
        let doc = document();
        let properties = doc["components"]["schemas"]["CompletionRequest"]["properties"]
            .as_object()
            .expect("properties");
        let mut documented: Vec<&str> = properties.keys().map(String::as_str).collect();
        let mut known = KNOWN_FIELDS.to_vec();
        documented.sort_unstable();
        known.sort_unstable();
        assert_eq!(documented, known);
        for (name, schema) in properties {
            assert!(
                schema["description"].is_string(),
                "{name} has no description"
            );
        }
    }

    #[test]
    fn the_chat_request_schema_lists_exactly_the_fields_the_chat_parser_knows() {
        let doc = document();
        let properties = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
            .as_object()
            .expect("properties");
        let mut documented: Vec<&str> = properties.keys().map(String::as_str).collect();
        let refused: Vec<&str> = ferrite_protocol::NOT_FOR_CHAT
            .iter()
            .map(|(f, _)| *f)
            .collect();
        let mut known: Vec<&str> = KNOWN_FIELDS
            .iter()
            .chain(ferrite_protocol::CHAT_ONLY_FIELDS)
            .copied()
            .filter(|f| !refused.contains(f))
            .collect();
        documented.sort_unstable();
        known.sort_unstable();
        assert_eq!(documented, known);
    }

    #[test]
    fn every_route_is_described() {
        // The router's own table against the document: no route left out of either.
        let doc = document();
        let mut described: Vec<&str> = doc["paths"]
            .as_object()
            .expect("paths")
            .keys()
            .map(String::as_str)
            .collect();
        let mut served = crate::routes::served_paths();
        described.sort_unstable();
        served.sort_unstable();
        assert_eq!(described, served);
        let statuses = doc["paths"]["/v1/completions"]["post"]["responses"]
            .as_object()
            .unwrap();
        for status in [
            "200", "400", "401", "404", "413", "415", "429", "503", "504",
        ] {
            assert!(statuses.contains_key(status), "{status}");
        }
    }
}
