//! A request body read into its wire type: JSON syntax, unknown fields, required fields,
//! then types, each error a 400 naming its field.
//!
//! The completions body is read straight into its type, never into a JSON tree first: a
//! tree costs 32 bytes a value, so an 8 MiB body of token ids would take 128 MiB before
//! its first check. Its top-level fields are looked at as the text they are in the body.

use std::collections::BTreeMap;
use std::fmt::Display;

use ferrite_protocol::{CompletionRequest, KNOWN_FIELDS};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Parses a completions body: JSON syntax, unknown fields, then types, each error naming
/// its field. With `ignore_unknown`, fields no vendor documents are dropped instead.
pub fn parse_body(body: &[u8], ignore_unknown: bool) -> Result<CompletionRequest, ApiError> {
    // Each top-level field as its text in the body: nothing is copied.
    let fields: BTreeMap<String, &RawValue> = match serde_json::from_slice(body) {
        Ok(fields) => fields,
        Err(e) if e.is_data() => {
            return Err(ApiError::invalid_body("the body must be a JSON object"))
        }
        Err(e) => return Err(not_json(e)),
    };
    // Unknown fields (when ignored) are left out of the struct, which has none.
    unknown_fields(fields.keys(), KNOWN_FIELDS, ignore_unknown)?;
    require_where(&["model", "prompt"], |field| {
        fields.get(field).is_some_and(|v| v.get() != "null")
    })?;
    deserialize_body(body)
}

/// Reads a body straight into `T`; a type error is a 400 whose `param` is the top-level
/// field it sits in.
pub fn deserialize_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut reader = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut reader).map_err(|e| {
        if e.inner().is_data() {
            naming_the_field(e)
        } else {
            not_json(e.into_inner())
        }
    })?;
    reader.end().map_err(not_json)?;
    Ok(value)
}

/// The 400 of a body that is not JSON.
fn not_json(e: serde_json::Error) -> ApiError {
    ApiError::invalid_body(format!("the body is not valid JSON: {e}"))
}

/// The body as a JSON object, or a 400 saying what it is instead.
pub(super) fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid_body(format!("the body is not valid JSON: {e}")))?;
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(ApiError::invalid_body("the body must be a JSON object")),
    }
}

/// A 400 naming the first field not in `known`; with `ignore_unknown`, such fields are
/// dropped instead.
pub(super) fn drop_unknown(
    map: &mut Map<String, Value>,
    known: &[&str],
    ignore_unknown: bool,
) -> Result<(), ApiError> {
    for key in unknown_fields(map.keys(), known, ignore_unknown)? {
        map.remove(&key);
    }
    Ok(())
}

/// The fields among `keys` not in `known`, or a 400 naming the first of them unless
/// `ignore_unknown`.
fn unknown_fields<'a>(
    keys: impl IntoIterator<Item = &'a String>,
    known: &[&str],
    ignore_unknown: bool,
) -> Result<Vec<String>, ApiError> {
    let unknown: Vec<String> = keys
        .into_iter()
        .filter(|k| !known.contains(&k.as_str()))
        .cloned()
        .collect();
    match unknown.first() {
        Some(first) if !ignore_unknown => Err(ApiError::invalid(
            first.clone(),
            format!("Unrecognized request argument supplied: {first}"),
        )),
        _ => Ok(unknown),
    }
}

/// A 400 naming the first of `fields` that is missing or null.
pub(super) fn require(map: &Map<String, Value>, fields: &[&str]) -> Result<(), ApiError> {
    require_where(fields, |field| map.get(field).is_some_and(|v| !v.is_null()))
}

/// A 400 naming the first of `fields` that `present` says is missing or null.
fn require_where(fields: &[&str], present: impl Fn(&str) -> bool) -> Result<(), ApiError> {
    for &required in fields {
        if !present(required) {
            return Err(ApiError::invalid(
                required,
                format!("`{required}` is required"),
            ));
        }
    }
    Ok(())
}

/// Deserializes a JSON value into `T`; a type error is a 400 whose `param` is the
/// top-level field it sits in.
pub fn deserialize_naming_the_field<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(naming_the_field)
}

/// The 400 of a value of the wrong type, naming the top-level field it sits in.
fn naming_the_field<E: Display>(e: serde_path_to_error::Error<E>) -> ApiError {
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
    if param.is_empty() || param == "." {
        ApiError::invalid_body(message)
    } else {
        ApiError::invalid(param, message)
    }
}
