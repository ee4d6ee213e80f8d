//! A tool's parameters keep their meaning inside the call grammar. The grammar of a call
//! puts each tool's parameters at `properties.arguments` of a larger schema and gathers
//! their `$defs` at its root, so references into `$defs`/`definitions` (Pydantic's) still
//! point where they did; but one to the parameters' root (`#`, a recursive tree) or into
//! them (`#/properties/…`) would point into the larger schema instead: `{"$ref": "#"}`
//! with `tool_choice: required` made the grammar expect a list of calls inside a call,
//! and the model wrote `[` and nothing more. Such parameters are moved into `$defs` under
//! a name of their own and their references rewritten to follow them.

use serde_json::{json, Map, Value};

/// Where a JSON schema keeps the subschemas its `$ref`s point at.
pub(super) const DEFINITIONS: [&str; 2] = ["$defs", "definitions"];

/// `parameters` of tool `name`, with references to its root or into it rewritten as
/// references into a definition that holds it (unchanged when it has none). An error
/// when a chain of schemas that are nothing but a `$ref` comes back to itself
/// (`{"$ref": "#"}`): no value matches it.
pub fn rooted(name: &str, parameters: Value) -> Result<Value, String> {
    if !has_root_refs(&parameters) {
        return Ok(parameters);
    }
    let root = format!("tool-{}", name.replace('~', "~0").replace('/', "~1"));
    let target = format!("#/$defs/{root}");
    let mut body = parameters;
    rewrite(&mut body, &target);
    let mut defs = Map::new();
    let mut out = Map::new();
    if let Value::Object(map) = &mut body {
        for key in DEFINITIONS {
            match (key, map.remove(key)) {
                ("$defs", Some(Value::Object(own))) => defs.extend(own),
                (_, Some(other)) => {
                    out.insert(key.to_string(), other);
                }
                _ => {}
            }
        }
    }
    defs.insert(root, body);
    out.insert("$ref".into(), json!(target));
    out.insert("$defs".into(), Value::Object(defs));
    let out = Value::Object(out);
    check_ref_loops(&out).map_err(|at| {
        format!("the parameters of tool `{name}` are a `$ref` to themselves (through {at}): no value matches them")
    })?;
    Ok(out)
}

/// The reference of a schema that is nothing but a `$ref`.
fn only_ref(node: &Value) -> Option<&str> {
    match node {
        Value::Object(map) if map.len() == 1 => map.get("$ref").and_then(Value::as_str),
        _ => None,
    }
}

/// Follows each chain of schemas that are only a local `$ref`; `Err` names a reference
/// that comes back to a schema of its chain.
fn check_ref_loops(schema: &Value) -> Result<(), String> {
    let mut starts = vec![schema];
    for key in DEFINITIONS {
        if let Some(Value::Object(defs)) = schema.get(key) {
            starts.extend(defs.values());
        }
    }
    for start in starts {
        let mut seen = Vec::new();
        let mut node = start;
        while let Some(reference) = only_ref(node) {
            if seen.contains(&reference) {
                return Err(reference.to_string());
            }
            seen.push(reference);
            match reference
                .strip_prefix('#')
                .and_then(|pointer| schema.pointer(pointer))
            {
                Some(next) => node = next,
                None => break,
            }
        }
    }
    Ok(())
}

/// Whether a local reference is to the root or into it other than into its definitions.
fn is_root_ref(reference: &str) -> bool {
    reference == "#"
        || reference.strip_prefix("#/").is_some_and(|rest| {
            !DEFINITIONS
                .iter()
                .any(|d| rest.strip_prefix(d).is_some_and(|r| r.starts_with('/')))
        })
}

fn has_root_refs(value: &Value) -> bool {
    match value {
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| (k == "$ref" && v.as_str().is_some_and(is_root_ref)) || has_root_refs(v)),
        Value::Array(items) => items.iter().any(has_root_refs),
        _ => false,
    }
}

/// Points every root reference in `value` at `target` (the same place under it).
fn rewrite(value: &mut Value, target: &str) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                match v {
                    Value::String(reference) if k == "$ref" && is_root_ref(reference) => {
                        *reference = format!("{target}{}", &reference[1..]);
                    }
                    _ => rewrite(v, target),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rewrite(v, target)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_to_the_root_follow_it_into_a_definition() {
        let tree = json!({"type": "object", "properties": {
            "name": {"type": "string"},
            "kids": {"type": "array", "items": {"$ref": "#"}},
            "first": {"$ref": "#/properties/name"},
            "kind": {"$ref": "#/$defs/Kind"},
        }, "$defs": {"Kind": {"enum": ["a", "b"]}}});
        let out = rooted("t/x", tree).unwrap();
        assert_eq!(out["$ref"], "#/$defs/tool-t~1x");
        let root = &out["$defs"]["tool-t~1x"];
        assert_eq!(
            root["properties"]["kids"]["items"]["$ref"],
            "#/$defs/tool-t~1x"
        );
        assert_eq!(
            root["properties"]["first"]["$ref"],
            "#/$defs/tool-t~1x/properties/name"
        );
        assert_eq!(root["properties"]["kind"]["$ref"], "#/$defs/Kind");
        assert_eq!(out["$defs"]["Kind"], json!({"enum": ["a", "b"]}));
        assert!(root.get("$defs").is_none());
    }

    #[test]
    fn parameters_without_root_references_are_unchanged() {
        let plain = json!({"type": "object", "properties": {"k": {"$ref": "#/definitions/K"}},
            "definitions": {"K": {"type": "integer"}}});
        assert_eq!(rooted("t", plain.clone()), Ok(plain));
    }

    #[test]
    fn a_schema_that_is_only_a_reference_to_itself_is_refused() {
        let err = rooted("f", json!({"$ref": "#"})).unwrap_err();
        assert!(err.contains("`f`"), "{err}");
        let pair = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}},
            "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "x": {"$ref": "#"}});
        assert!(rooted("g", pair).is_err());
    }
}
