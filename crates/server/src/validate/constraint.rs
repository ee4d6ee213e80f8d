//! The structured-output fields: `response_format`, `guided_json`, `guided_regex`,
//! `guided_choice`, `guided_grammar`, `grammar`, and `tools` with a constraining
//! `tool_choice`. At most one may constrain a request; the one that does becomes a
//! [`Grammar`] for the engine, named by its field for error messages.

use std::collections::HashSet;

use ferrite_engine::constrain::{Grammar, GrammarKind};
use ferrite_protocol::CompletionRequest;
use serde_json::{json, Map, Value};

use super::tool_refs::DEFINITIONS;
use crate::error::ApiError;

/// A request's constraint and the field it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputConstraint {
    /// The field that asked for it (for error messages).
    pub field: &'static str,
    /// What the output must follow.
    pub grammar: Grammar,
    /// Set where the request did not ask for the constraint, only for output that parses
    /// (`tool_choice: auto`): one that does not compile leaves the output free instead of
    /// refusing the request.
    pub best_effort: bool,
}

/// The 400 for a second field constraining the output beside the first.
pub fn both_constrain(first: &str, second: &'static str) -> ApiError {
    ApiError::invalid(
        second,
        format!("`{first}` and `{second}` both constrain the output; use one"),
    )
}

/// How generated JSON is laid out unless the schema says otherwise (`x-guidance`): one
/// space after `,` and `:` and no other whitespace, as Python's `json.dumps` writes it.
/// Free whitespace lets small models wander into blank lines until `max_tokens`.
pub fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

fn schema_text(field: &str, schema: &Value) -> Result<String, ApiError> {
    let mut schema = match schema {
        Value::Object(_) | Value::Bool(_) => schema.clone(),
        // A schema may come as JSON text.
        Value::String(text) => serde_json::from_str::<Value>(text)
            .map_err(|e| ApiError::invalid(field, format!("`{field}` is not valid JSON: {e}")))?,
        _ => {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` must be a JSON schema (an object)"),
            ))
        }
    };
    close_objects(&mut schema);
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(json_layout);
    }
    Ok(schema.to_string())
}

/// Closes every object schema that declares `properties` but says nothing of others
/// (no `additionalProperties` or `unevaluatedProperties`): it gets `additionalProperties:
/// false`, as llama.cpp's schema converter and vLLM's default engine read such a schema.
/// Left open, a small model fills a tool's arguments with keys nobody declared and may
/// never close the object. An explicit `additionalProperties: true` keeps one open.
///
/// Parts that apply to the same object together are intersected key by key, so closing
/// one of them would forbid the others' properties: the parts of an `allOf`, a schema
/// beside a `$ref` and the definition it names, `if`/`then`/`else`, `dependentSchemas`,
/// and the `anyOf`/`oneOf` branches of a schema that has `properties` of its own. Those,
/// the schema that holds them, and the local definitions (`#/$defs/…`) they name are left
/// as written; so are conditions (`not`, `if`, `contains`, `propertyNames`), whose meaning
/// closing would change. Alternatives (the `anyOf`/`oneOf` branches of a schema without
/// properties of its own), properties, items and other definitions are closed each.
pub fn close_objects(schema: &mut Value) {
    let mut merged = HashSet::new();
    merged_refs(schema, &mut merged);
    close_below(schema, true, &merged);
}

/// Keywords that say nothing of the keys an object takes (definitions only hold schemas
/// for references).
const ANNOTATIONS: [&str; 10] = [
    "$ref",
    "$defs",
    "definitions",
    "$schema",
    "$id",
    "description",
    "title",
    "default",
    "examples",
    "$comment",
];

/// Whether `map` has `properties` of its own beside `anyOf`/`oneOf` branches, which then
/// apply to the same object.
fn merges_branches(map: &Map<String, Value>) -> bool {
    map.contains_key("properties") && (map.contains_key("anyOf") || map.contains_key("oneOf"))
}

/// The local `$ref`s, JSON-pointer escapes undone, that name a part merged with others:
/// an `allOf` part's, a merged branch's, and one with keywords beside it.
fn merged_refs(schema: &Value, out: &mut HashSet<String>) {
    let unescape = |r: &str| r.replace("~1", "/").replace("~0", "~");
    match schema {
        Value::Object(map) => {
            let mut parts: Vec<&Value> = Vec::new();
            if let Some(Value::Array(all)) = map.get("allOf") {
                parts.extend(all);
            }
            if merges_branches(map) {
                for key in ["anyOf", "oneOf"] {
                    if let Some(Value::Array(branches)) = map.get(key) {
                        parts.extend(branches);
                    }
                }
            }
            out.extend(
                parts
                    .iter()
                    .filter_map(|p| p.get("$ref")?.as_str().map(unescape)),
            );
            if let Some(r) = map.get("$ref").and_then(Value::as_str) {
                if map.keys().any(|k| !ANNOTATIONS.contains(&k.as_str())) {
                    out.insert(unescape(r));
                }
            }
            map.values().for_each(|v| merged_refs(v, out));
        }
        Value::Array(list) => list.iter().for_each(|v| merged_refs(v, out)),
        _ => {}
    }
}

fn close_below(schema: &mut Value, may_close: bool, merged: &HashSet<String>) {
    let Value::Object(map) = schema else {
        return;
    };
    let merges = merges_branches(map);
    let intersected = merges
        || ["allOf", "$ref", "if", "dependentSchemas"]
            .iter()
            .any(|k| map.contains_key(*k));
    if may_close
        && !intersected
        && map.contains_key("properties")
        && !map.contains_key("additionalProperties")
        && !map.contains_key("unevaluatedProperties")
    {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, value) in map.iter_mut() {
        match (key.as_str(), value) {
            ("properties" | "patternProperties", Value::Object(named)) => named
                .values_mut()
                .for_each(|s| close_below(s, true, merged)),
            (defs @ ("$defs" | "definitions"), Value::Object(named)) => {
                for (name, s) in named.iter_mut() {
                    let path = format!("#/{defs}/{name}");
                    close_below(s, !merged.contains(&path), merged);
                }
            }
            ("allOf", Value::Array(parts)) => {
                parts.iter_mut().for_each(|s| close_below(s, false, merged))
            }
            ("anyOf" | "oneOf", Value::Array(branches)) => branches
                .iter_mut()
                .for_each(|s| close_below(s, !merges, merged)),
            ("prefixItems" | "items", Value::Array(list)) => {
                list.iter_mut().for_each(|s| close_below(s, true, merged))
            }
            (
                "items"
                | "additionalItems"
                | "additionalProperties"
                | "unevaluatedProperties"
                | "unevaluatedItems",
                one,
            ) => close_below(one, true, merged),
            _ => {}
        }
    }
}

fn json_schema(field: &'static str, schema: &Value) -> Result<OutputConstraint, ApiError> {
    Ok(OutputConstraint {
        field,
        grammar: Grammar {
            kind: GrammarKind::JsonSchema,
            source: schema_text(field, schema)?,
        },
        best_effort: false,
    })
}

fn text_grammar(field: &'static str, kind: GrammarKind, source: &str) -> OutputConstraint {
    OutputConstraint {
        field,
        grammar: Grammar {
            kind,
            source: source.to_string(),
        },
        best_effort: false,
    }
}

/// `response_format`: text (no constraint), `json_object` (any object, or the `schema`
/// given beside it), `json_schema` (`json_schema.schema`), or `grammar`.
fn response_format(v: &Value) -> Result<Option<OutputConstraint>, ApiError> {
    const FIELD: &str = "response_format";
    let kind = v
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(FIELD, "`response_format.type` must be a string"))?;
    match kind {
        "text" => Ok(None),
        "json_object" => match v.get("schema") {
            Some(schema) if !schema.is_null() => json_schema(FIELD, schema).map(Some),
            _ => json_schema(FIELD, &json!({"type": "object"})).map(Some),
        },
        "json_schema" => {
            let schema = v
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .filter(|s| !s.is_null())
                .ok_or_else(|| {
                    ApiError::invalid(
                        FIELD,
                        "`response_format` of type `json_schema` needs `json_schema.schema`",
                    )
                })?;
            json_schema(FIELD, schema).map(Some)
        }
        "grammar" => {
            let grammar = v.get("grammar").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(FIELD, "`response_format.grammar` must be a string")
            })?;
            Ok(Some(text_grammar(FIELD, GrammarKind::Llguidance, grammar)))
        }
        other => Err(ApiError::invalid(
            FIELD,
            format!("`response_format.type` must be text, json_object, json_schema or grammar, got {other:?}"),
        )),
    }
}

/// `grammar`: `{"type": "regex" | "json_schema" | "lark" | "llguidance", "value": …}`.
fn grammar(v: &Value) -> Result<OutputConstraint, ApiError> {
    const FIELD: &str = "grammar";
    let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
    let value = v
        .get("value")
        .filter(|x| !x.is_null())
        .ok_or_else(|| ApiError::invalid(FIELD, "`grammar` needs `type` and `value`"))?;
    let text = |kind| match value.as_str() {
        Some(s) => Ok(text_grammar(FIELD, kind, s)),
        None => Err(ApiError::invalid(FIELD, "`grammar.value` must be a string")),
    };
    match kind {
        "regex" => text(GrammarKind::Regex),
        "lark" => text(GrammarKind::Lark),
        "llguidance" => match value {
            Value::String(_) => text(GrammarKind::Llguidance),
            other => Ok(text_grammar(
                FIELD,
                GrammarKind::Llguidance,
                &other.to_string(),
            )),
        },
        "json_schema" => json_schema(FIELD, value),
        other => Err(ApiError::invalid(
            FIELD,
            format!("`grammar.type` must be regex, json_schema, lark or llguidance, got {other:?}"),
        )),
    }
}

/// `guided_choice`: exactly one of the strings.
fn choice(choices: &[String]) -> Result<OutputConstraint, ApiError> {
    if choices.is_empty() {
        return Err(ApiError::invalid(
            "guided_choice",
            "`guided_choice` must list at least one choice",
        ));
    }
    let alternatives: Vec<String> = choices
        .iter()
        .map(|c| format!("({})", regex_syntax::escape(c)))
        .collect();
    Ok(text_grammar(
        "guided_choice",
        GrammarKind::Regex,
        &alternatives.join("|"),
    ))
}

/// `tool_choice`: whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No call (`none`, or no tools).
    None,
    /// The model decides (`auto`, the default with tools).
    Auto,
    /// A call of any tool (`required`).
    Required,
    /// A call of this function.
    Named(String),
}

/// Reads `tool_choice` (default: `auto` with tools, `none` without). A choice other than
/// `none` without any tool is a 400, as OpenAI and vLLM answer it.
pub fn tool_choice(value: Option<&Value>, has_tools: bool) -> Result<ToolChoice, ApiError> {
    let choice = match value {
        None | Some(Value::Null) if has_tools => ToolChoice::Auto,
        None | Some(Value::Null) => ToolChoice::None,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) if v.get("type").and_then(Value::as_str) == Some("function") => {
                ToolChoice::Named(name.to_string())
            }
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "`tool_choice` must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}",
                ))
            }
        },
    };
    if choice != ToolChoice::None && !has_tools {
        return Err(ApiError::invalid(
            "tool_choice",
            "`tool_choice` other than \"none\" needs `tools`: there is no tool to call",
        ));
    }
    Ok(choice)
}

/// One tool the client offers.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    /// The function's name.
    pub name: String,
    /// The JSON schema of its arguments (`{"type": "object"}` when none is given).
    pub parameters: Value,
}

/// Checks `tools`: each `{"type": "function", "function": {"name": …, "parameters": {…}}}`,
/// a name of at most `max_name_bytes`, no two with one name (a call could not say which
/// it is).
pub fn tool_definitions(
    tools: &[Value],
    max_name_bytes: usize,
) -> Result<Vec<ToolDefinition>, ApiError> {
    let definitions = tools
        .iter()
        .map(|tool| {
            let function = tool
                .get("function")
                .filter(|_| tool.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tools",
                        "each tool must be {\"type\": \"function\", \"function\": {…}}",
                    )
                })?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| ApiError::invalid("tools", "each tool's function needs a `name`"))?;
            if name.len() > max_name_bytes {
                return Err(ApiError::invalid(
                    "tools",
                    format!(
                        "a tool's name is {} bytes long; at most {max_name_bytes} are allowed (`--max-tool-name-bytes`)",
                        name.len()
                    ),
                ));
            }
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object"}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "tools",
                        format!(
                            "the `parameters` of tool `{name}` must be a JSON schema (an object)"
                        ),
                    ))
                }
            };
            Ok(ToolDefinition {
                name: name.to_string(),
                parameters: super::tool_refs::rooted(name, parameters)
                    .map_err(|e| ApiError::invalid("tools", e))?,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let mut names: Vec<&str> = definitions.iter().map(|d| d.name.as_str()).collect();
    names.sort_unstable();
    if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(ApiError::invalid(
            "tools",
            format!("two tools are named `{}`; tool names must differ", twice[0]),
        ));
    }
    Ok(definitions)
}

/// The tools `choice` allows: all of them for `required`, the named one alone (a 400 when
/// it is not among them, or when `required` has none to call).
pub fn chosen_tools<'a>(
    tools: &'a [ToolDefinition],
    choice: &ToolChoice,
) -> Result<Vec<&'a ToolDefinition>, ApiError> {
    let wanted = match choice {
        ToolChoice::Named(name) => Some(name.as_str()),
        _ => None,
    };
    let chosen: Vec<_> = tools
        .iter()
        .filter(|t| wanted.is_none_or(|w| w == t.name))
        .collect();
    if chosen.is_empty() {
        let message = match wanted {
            Some(name) => format!("`tool_choice` names `{name}`, which is not among `tools`"),
            None => "`tool_choice: \"required\"` needs at least one tool in `tools`".to_string(),
        };
        return Err(ApiError::invalid("tool_choice", message));
    }
    Ok(chosen)
}

/// The schema of one call of `tool`: `{"name": …, "arguments": {…}}`. Its parameters'
/// `$defs` are left out: [`tool_schema`] puts them at the root, where their `$ref`s
/// (`#/$defs/…`, as Pydantic writes them) point.
pub fn call_schema(tool: &ToolDefinition) -> Value {
    let mut parameters = tool.parameters.clone();
    if let Value::Object(map) = &mut parameters {
        for key in DEFINITIONS {
            map.remove(key);
        }
    }
    json!({
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": false,
    })
}

/// The schema of one call of any of `tools`.
pub fn any_call_schema(tools: &[&ToolDefinition]) -> Value {
    let mut calls: Vec<Value> = tools.iter().map(|t| call_schema(t)).collect();
    if calls.len() == 1 {
        calls.remove(0)
    } else {
        json!({"anyOf": calls})
    }
}

/// `schema` (built from `tools`' parameters) made ready to compile: the tools'
/// `$defs`/`definitions` gathered at its root (a name two tools define differently is a
/// 400), and llguidance told to be lenient, as OpenAI is, with what it does not implement
/// (`format: int32`, unknown keywords), and to lay the JSON out compactly.
pub fn tool_schema(mut schema: Value, tools: &[&ToolDefinition]) -> Result<Value, ApiError> {
    for key in DEFINITIONS {
        let mut gathered = Map::new();
        for tool in tools {
            let Some(Value::Object(defs)) = tool.parameters.get(key) else {
                continue;
            };
            for (name, def) in defs {
                match gathered.get(name) {
                    Some(other) if other != def => {
                        return Err(ApiError::invalid(
                            "tools",
                            format!("two tools define `{key}/{name}` differently; give them different names"),
                        ))
                    }
                    _ => {
                        gathered.insert(name.clone(), def.clone());
                    }
                }
            }
        }
        if !gathered.is_empty() {
            schema[key] = Value::Object(gathered);
        }
    }
    close_objects(&mut schema);
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(|| {
            let mut guidance = json_layout();
            guidance["lenient"] = json!(true);
            guidance
        });
    }
    Ok(schema)
}

/// A JSON-schema constraint asked for by `tool_choice`.
pub fn tool_constraint(schema: &Value) -> Result<OutputConstraint, ApiError> {
    json_schema("tool_choice", schema)
}

/// `tools` with `tool_choice` on a text completion: `required` constrains the output to a
/// call of any tool, a named function to a call of that one: `{"name": …, "arguments":
/// {…}}` valid for the tool's `parameters`. `auto`, `none` or no choice leave the output
/// free.
fn tool_call(
    tools: &[Value],
    tool_choice_value: Option<&Value>,
    max_name_bytes: usize,
) -> Result<Option<OutputConstraint>, ApiError> {
    let choice = tool_choice(tool_choice_value, !tools.is_empty())?;
    if matches!(choice, ToolChoice::None | ToolChoice::Auto) {
        return Ok(None);
    }
    let tools = tool_definitions(tools, max_name_bytes)?;
    let chosen = chosen_tools(&tools, &choice)?;
    tool_constraint(&tool_schema(any_call_schema(&chosen), &chosen)?).map(Some)
}

/// The request's constraint, if any: a 400 naming both fields when two constrain it.
/// Tool names may be `max_tool_name_bytes` long.
pub fn output_constraint(
    r: &CompletionRequest,
    max_tool_name_bytes: usize,
) -> Result<Option<OutputConstraint>, ApiError> {
    let mut found: Vec<OutputConstraint> = Vec::new();
    if let Some(v) = r.response_format.as_ref().filter(|v| !v.is_null()) {
        found.extend(response_format(v)?);
    }
    if let Some(v) = r.guided_json.as_ref().filter(|v| !v.is_null()) {
        found.push(json_schema("guided_json", v)?);
    }
    if let Some(rx) = &r.guided_regex {
        found.push(text_grammar("guided_regex", GrammarKind::Regex, rx));
    }
    if let Some(choices) = &r.guided_choice {
        found.push(choice(choices)?);
    }
    if let Some(g) = &r.guided_grammar {
        found.push(text_grammar("guided_grammar", GrammarKind::Lark, g));
    }
    if let Some(v) = r.grammar.as_ref().filter(|v| !v.is_null()) {
        found.push(grammar(v)?);
    }
    if let Some(c) = tool_call(
        r.tools.as_deref().unwrap_or_default(),
        r.tool_choice.as_ref(),
        max_tool_name_bytes,
    )? {
        found.push(c);
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(both_constrain(found[0].field, found[1].field)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closed(schema: Value) -> Value {
        let mut schema = schema;
        close_objects(&mut schema);
        schema
    }

    #[test]
    fn objects_with_properties_are_closed_unless_they_say_otherwise() {
        let nested = json!({"type": "object", "properties": {
            "city": {"type": "string"},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {}}}},
            "either": {"anyOf": [{"type": "object", "properties": {"a": {}}}, {"type": "null"}]},
        }});
        let out = closed(nested);
        assert_eq!(out["additionalProperties"], false);
        assert_eq!(out["properties"]["where"]["additionalProperties"], false);
        assert_eq!(
            out["properties"]["tags"]["items"]["additionalProperties"],
            false
        );
        assert_eq!(
            out["properties"]["either"]["anyOf"][0]["additionalProperties"],
            false
        );
        // Said open, or free-form (no `properties`), stays so.
        let open = json!({"type": "object", "properties": {"a": {}}, "additionalProperties": true});
        assert_eq!(closed(open.clone()), open);
        let free = json!({"type": "object"});
        assert_eq!(closed(free.clone()), free);
        let typed = json!({"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}});
        assert_eq!(closed(typed.clone()), typed);
        // Definitions are closed where nothing merges them.
        let defs = closed(json!({"$defs": {"G": {"properties": {"n": {}}}}, "$ref": "#/$defs/G"}));
        assert_eq!(defs["$defs"]["G"]["additionalProperties"], false);
        assert!(defs.get("additionalProperties").is_none());
    }

    #[test]
    fn parts_merged_into_one_object_are_left_open() {
        let schema = json!({
            "$defs": {"Base": {"type": "object", "properties": {"id": {}}}},
            "allOf": [
                {"$ref": "#/$defs/Base"},
                {"type": "object", "properties": {"name": {}, "inner": {"properties": {"x": {}}}}},
            ],
        });
        let out = closed(schema);
        assert!(out.get("additionalProperties").is_none());
        assert!(out["$defs"]["Base"].get("additionalProperties").is_none());
        assert!(out["allOf"][1].get("additionalProperties").is_none());
        // What lies below a merged part is an object of its own.
        assert_eq!(
            out["allOf"][1]["properties"]["inner"]["additionalProperties"],
            false
        );
        let conditional = json!({"properties": {"a": {}}, "if": {"properties": {"a": {"const": 1}}},
                                 "then": {"properties": {"b": {}}}});
        assert_eq!(closed(conditional.clone()), conditional);
        // Branches beside properties of the holder's own apply to the same object.
        let branched = json!({"properties": {"kind": {}},
                              "oneOf": [{"properties": {"kind": {}, "x": {}}}, {"$ref": "#/$defs/Y"}],
                              "$defs": {"Y": {"properties": {"y": {}}}}});
        assert_eq!(closed(branched.clone()), branched);
        // A schema beside a `$ref` merges with the definition, escaped names too.
        let extended = json!({"$ref": "#/$defs/a~1b", "properties": {"extra": {}},
                              "$defs": {"a/b": {"properties": {"id": {}}}}});
        assert_eq!(closed(extended.clone()), extended);
        // A bare `$ref` (annotations aside) does not.
        let bare = closed(
            json!({"properties": {"p": {"$ref": "#/$defs/P", "description": "d"}},
                                 "$defs": {"P": {"properties": {"q": {}}}}}),
        );
        assert_eq!(bare["$defs"]["P"]["additionalProperties"], false);
    }

    #[test]
    fn every_schema_field_is_closed() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
        let text = schema_text("guided_json", &schema).unwrap();
        let compiled: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(compiled["additionalProperties"], false);
        let tool = ToolDefinition {
            name: "weather".into(),
            parameters: schema,
        };
        let call = tool_schema(any_call_schema(&[&tool]), &[&tool]).unwrap();
        assert_eq!(
            call["properties"]["arguments"]["additionalProperties"],
            false
        );
    }
}
