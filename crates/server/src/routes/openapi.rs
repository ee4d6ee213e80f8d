//! `GET /openapi.json`: an OpenAPI 3.1 description of every route, its bodies and the
//! error shape. The request schema of `POST /v1/completions` lists every field the parser
//! accepts (a test keeps the two equal), each with the rule `docs/API.md` gives it (the
//! document links to that reference).

use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use ferrite_protocol::{CHAT_ONLY_FIELDS, CHAT_RULES, COMPLETION_FIELDS, NOT_FOR_CHAT};
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

/// Every request field of `POST /v1/completions`: its schema and what it does, drawn
/// from the fields' one declaration ([`COMPLETION_FIELDS`]).
fn completion_fields() -> Vec<(&'static str, Value)> {
    COMPLETION_FIELDS
        .iter()
        .map(|f| (f.name, f.schema()))
        .collect()
}

/// Every request field of `POST /v1/chat/completions`: the completion fields that make
/// sense for chat (with chat's rule where it differs, [`CHAT_RULES`]) and chat's own
/// ([`CHAT_ONLY_FIELDS`]).
fn chat_fields() -> Vec<(&'static str, Value)> {
    let refused: Vec<&str> = NOT_FOR_CHAT.iter().map(|(f, _)| *f).collect();
    COMPLETION_FIELDS
        .iter()
        .filter(|f| !refused.contains(&f.name))
        .map(|f| CHAT_RULES.iter().find(|c| c.name == f.name).unwrap_or(f))
        .chain(CHAT_ONLY_FIELDS)
        .map(|f| {
            let mut schema = f.schema();
            if f.name == "messages" {
                schema["items"] = message_schema();
            }
            (f.name, schema)
        })
        .collect()
}

/// The schema of one message of a chat request.
fn message_schema() -> Value {
    json!({"type": "object", "required": ["role"], "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"description": "Text, or text parts `{\"type\":\"text\",\"text\":…}` (joined by newlines); null for an assistant message with tool calls. With a vision model (`--mmproj`), `image_url` parts: a `data:` URI, or an http(s) URL of a host `--allowed-media-domains` allows. Audio, file and other parts are a 400.",
            "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}, {"type": "null"}]},
        "name": {"type": "string"}, "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string", "description": "Required on a tool message."}}})
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
    use ferrite_protocol::{with_field_tables, Field, KNOWN_FIELDS};

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
            .copied()
            .chain(CHAT_ONLY_FIELDS.iter().map(|f| f.name))
            .filter(|f| !refused.contains(f))
            .collect();
        documented.sort_unstable();
        known.sort_unstable();
        assert_eq!(documented, known);
    }

    /// `docs/API.md`'s field tables are the declarations' (`FERRITE_BLESS=1` rewrites them).
    #[test]
    fn the_reference_tables_are_the_declared_fields() {
        let fields: Vec<Field> = COMPLETION_FIELDS
            .iter()
            .chain(CHAT_ONLY_FIELDS)
            .chain(CHAT_RULES)
            .copied()
            .collect();
        let written = with_field_tables(API_REFERENCE, &fields).expect("the markers");
        if std::env::var_os("FERRITE_BLESS").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/API.md");
            std::fs::write(path, &written).expect("docs/API.md written");
            return;
        }
        assert!(
            written == API_REFERENCE,
            "docs/API.md's field tables are not the fields' declarations: \
             FERRITE_BLESS=1 cargo test -p ferrite-server reference_tables rewrites them"
        );
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
