//! Fuzzing the request parser (proptest; cargo-fuzz needs a nightly toolchain this
//! project does not use): raw bytes, arbitrary JSON, objects of the known fields with
//! arbitrary values, and valid requests with one field replaced. Every input must give
//! parameters or an error whose body serializes, never a panic.
//!
//! `cargo test --release -p ferrite-server fuzz_` runs a quick batch; with
//! `FERRITE_FUZZ_SECONDS=600` it runs batches for ten minutes (see RELIABILITY.md).

use ferrite_protocol::{CHAT_ONLY_FIELDS, KNOWN_FIELDS};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::{parse_body, parse_chat_body, FieldLimits, GenerateParams};

/// Any JSON value, numbers and strings biased toward edge cases.
fn json_value() -> impl Strategy<Value = Value> {
    let number = prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        prop_oneof![
            Just(0i64),
            Just(-1),
            Just(1),
            Just(2),
            Just(128),
            Just(129),
            Just(i64::from(u32::MAX)),
            Just(i64::MAX)
        ]
        .prop_map(Value::from),
        (-3.0f64..3.0).prop_map(Value::from),
    ];
    let string = prop_oneof![
        ".{0,24}".prop_map(Value::from),
        Just(Value::from("")),
        Just(Value::from("{\"type\": \"object\"}")),
        Just(Value::from("root ::= \"a\"")),
        Just(Value::from("[a-z]+")),
        Just(Value::from("smollm2-135m")),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        number,
        string,
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((field_name(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A known request field most of the time, else any short name.
fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(KNOWN_FIELDS).prop_map(str::to_string),
        1 => prop::sample::select(CHAT_ONLY_FIELDS).prop_map(|f| f.name.to_string()),
        1 => prop::sample::select(&["role", "content", "tool_calls", "tool_call_id", "name", "type", "text", "function", "arguments"][..]).prop_map(str::to_string),
        1 => "[a-z_]{1,12}",
    ]
}

/// A request most of whose fields make sense.
fn valid_request() -> Value {
    json!({
        "model": "smollm2-135m",
        "prompt": "Hello",
        "max_tokens": 8,
        "temperature": 0.7,
        "top_p": 0.9,
        "n": 2,
        "stop": ["\n"],
        "logprobs": 2,
        "seed": 7,
    })
}

/// Every kind of input the parser can meet.
fn request_bytes() -> impl Strategy<Value = (Vec<u8>, bool)> {
    let raw = prop::collection::vec(any::<u8>(), 0..256);
    let any_json = json_value().prop_map(|v| v.to_string().into_bytes());
    let known_fields = prop::collection::vec((field_name(), json_value()), 0..12).prop_map(|kv| {
        let mut map: Map<String, Value> = kv.into_iter().collect();
        map.entry("model").or_insert_with(|| json!("m"));
        map.entry("prompt").or_insert_with(|| json!("p"));
        Value::Object(map).to_string().into_bytes()
    });
    let one_changed = (field_name(), json_value()).prop_map(|(key, value)| {
        let mut request = valid_request();
        request[key] = value;
        request.to_string().into_bytes()
    });
    let inputs = prop_oneof![raw, any_json, known_fields, one_changed];
    (inputs, any::<bool>())
}

/// A chat request most of whose fields make sense.
fn valid_chat_request() -> Value {
    json!({
        "model": "smollm2-135m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "1"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": "required",
        "logprobs": true,
        "top_logprobs": 2,
        "max_completion_tokens": 8,
    })
}

/// Chat bodies: the shapes above, and a valid chat request with one field, one message
/// or one message's field replaced.
fn chat_request_bytes() -> impl Strategy<Value = (Vec<u8>, bool)> {
    let any_json = json_value().prop_map(|v| v.to_string().into_bytes());
    let one_changed = (field_name(), json_value()).prop_map(|(key, value)| {
        let mut request = valid_chat_request();
        request[key] = value;
        request.to_string().into_bytes()
    });
    let message_changed = (0..4usize, json_value()).prop_map(|(i, value)| {
        let mut request = valid_chat_request();
        request["messages"][i] = value;
        request.to_string().into_bytes()
    });
    let message_field_changed =
        (0..4usize, field_name(), json_value()).prop_map(|(i, key, value)| {
            let mut request = valid_chat_request();
            request["messages"][i][key] = value;
            request.to_string().into_bytes()
        });
    let inputs = prop_oneof![
        any_json,
        one_changed,
        message_changed,
        message_field_changed
    ];
    (inputs, any::<bool>())
}

/// Parses and validates one body; only a panic is a failure.
fn exercise(body: &[u8], ignore_unknown: bool) {
    let result = parse_body(body, ignore_unknown)
        .and_then(|r| GenerateParams::new(r, &FieldLimits::DEFAULT));
    check_error(result.err());
}

/// Parses and validates one chat body; only a panic is a failure.
fn exercise_chat(body: &[u8], ignore_unknown: bool) {
    check_error(parse_chat_body(body, ignore_unknown, &FieldLimits::DEFAULT).err());
}

/// An error must be a client error whose body serializes.
fn check_error(error: Option<crate::error::ApiError>) {
    if let Some(e) = error {
        let body = serde_json::to_string(&e.body()).expect("error bodies serialize");
        assert!(body.contains("\"message\""));
        assert!(
            e.status().is_client_error(),
            "{e:?} for {}",
            String::from_utf8_lossy(body.as_bytes())
        );
    }
}

#[test]
fn fuzz_chat_request_parser() {
    ferrite_fuzz::run(
        "chat request parser",
        chat_request_bytes(),
        3000,
        5000,
        |(body, ignore)| {
            exercise_chat(&body, ignore);
        },
    );
}

#[test]
fn fuzz_request_parser() {
    ferrite_fuzz::run(
        "request parser",
        request_bytes(),
        3000,
        5000,
        |(body, ignore)| {
            exercise(&body, ignore);
        },
    );
}
