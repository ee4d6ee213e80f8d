//! The one declaration of every request field: its name, type, default, rule and the
//! vendors that document it. The wire struct ([`crate::CompletionRequest`]) is written by
//! [`wire_fields!`] from the same lines that give the server its accepted names
//! ([`crate::KNOWN_FIELDS`]), `GET /openapi.json` its schemas ([`Field::schema`]) and
//! `docs/API.md` its field tables ([`markdown_table`]; a test keeps the file equal to
//! them). A chat request's own fields, which the chat route reads from the body by hand,
//! are declared in [`crate::CHAT_ONLY_FIELDS`] the same way.

use serde_json::{json, Value};

/// The table of `docs/API.md` a field's row sits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// "Prompt, length and model".
    Prompt,
    /// "Sampling".
    Sampling,
    /// "Choices and stopping".
    Choices,
    /// "What comes back".
    Output,
    /// "Structured output".
    Structured,
    /// "Other fields".
    Other,
    /// A chat request's fields ("Chat request fields").
    Chat,
}

impl Section {
    /// Every section, in the document's order.
    pub const ALL: [Section; 7] = [
        Section::Prompt,
        Section::Sampling,
        Section::Choices,
        Section::Output,
        Section::Structured,
        Section::Other,
        Section::Chat,
    ];

    /// The name of the section's marker in `docs/API.md`
    /// (`<!-- fields: NAME -->` … `<!-- end fields -->`).
    pub fn marker(self) -> &'static str {
        match self {
            Section::Prompt => "prompt",
            Section::Sampling => "sampling",
            Section::Choices => "choices",
            Section::Output => "output",
            Section::Structured => "structured",
            Section::Other => "other",
            Section::Chat => "chat",
        }
    }
}

/// One request field as documented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// Its name in the body.
    pub name: &'static str,
    /// The table it is listed in.
    pub section: Section,
    /// Its JSON type as the docs write it: `int ≥ 0`, `string or string[]`,
    /// `"truncate", "error"` (alternatives separated by `,` or ` or `; `X[]` a list of X;
    /// a quoted word one allowed string; ``object `{"key": type, …}` `` an object of those
    /// keys, and ``object `{"<name>": type}` `` one whose every value has that type).
    /// [`Field::schema`] reads the same text.
    pub ty: &'static str,
    /// What an absent or `null` field means.
    pub default: &'static str,
    /// What it does and which values are refused (Markdown; the field's doc comment).
    pub rule: &'static str,
    /// The vendors whose request documents it: O(penAI), V(LLM), F(ireworks),
    /// M(istral.rs), G(ateway), or `all`.
    pub clients: &'static str,
}

impl Field {
    /// Its JSON schema for the OpenAPI document: the type read from [`Field::ty`], the rule
    /// (and the default) as its description.
    pub fn schema(&self) -> Value {
        let mut schema = schema_of(self.ty);
        let rule = one_line(self.rule);
        let description = match self.default {
            "none" | "—" | "" | "required" => rule,
            default => format!("{rule} Default: {default}."),
        };
        schema["description"] = Value::String(description);
        schema
    }
}

/// Declares a wire struct whose every field carries its documentation row, and the two
/// lists drawn from it: the names (`names`) and the rows (`fields`). Each field is written
///
/// ```text
/// /// The rule, in Markdown (the field's doc comment and its row's rule).
/// #[field(Section, "type", "default", "clients")]
/// pub name: Type,
/// ```
#[macro_export]
macro_rules! wire_fields {
    (
        $(#[$meta:meta])*
        pub struct $name:ident, names: $names:ident, fields: $table:ident {
            $(
                $(#[doc = $doc:literal])+
                #[field($section:ident, $ty:literal, $default:literal, $clients:literal)]
                pub $field:ident : $fty:ty,
            )+
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[doc = $doc])+ pub $field: $fty, )+
        }

        /// The name of every field of the struct, in declaration order: a body field
        /// outside this list is an unknown field.
        pub const $names: &[&str] = &[$(stringify!($field)),+];

        /// Every field's documentation row, in declaration order.
        pub const $table: &[$crate::Field] = &[$(
            $crate::Field {
                name: stringify!($field),
                section: $crate::Section::$section,
                ty: $ty,
                default: $default,
                rule: concat!($($doc),+),
                clients: $clients,
            }
        ),+];
    };
}

/// A rule's doc-comment lines as one line.
fn one_line(rule: &str) -> String {
    rule.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The JSON schema of a type as [`Field::ty`] writes it.
pub fn schema_of(ty: &str) -> Value {
    if let Some(keys) = ty
        .strip_prefix("object `{")
        .and_then(|t| t.strip_suffix("}`"))
    {
        return object_of(keys);
    }
    let alternatives: Vec<&str> = ty
        .split(" or ")
        .flat_map(|part| part.split(", "))
        .map(|a| a.trim().trim_matches('`'))
        .collect();
    let literals: Vec<&str> = alternatives
        .iter()
        .filter_map(|a| a.strip_prefix('"')?.strip_suffix('"'))
        .collect();
    if literals.len() == alternatives.len() {
        return json!({ "type": "string", "enum": literals });
    }
    let mut schemas: Vec<Value> = alternatives.iter().map(|a| one_schema(a)).collect();
    if schemas.len() == 1 {
        schemas.remove(0)
    } else {
        json!({ "oneOf": schemas })
    }
}

/// The schema of an object from its keys as the docs write them (`"key": type, …`, or
/// one `"<name>": type` for any key).
fn object_of(keys: &str) -> Value {
    let mut properties = serde_json::Map::new();
    for pair in keys.split(", ") {
        let (key, ty) = pair.split_once(": ").unwrap_or((pair, "any"));
        let key = key.trim_matches('"');
        if key.starts_with('<') {
            return json!({ "type": "object", "additionalProperties": one_schema(ty) });
        }
        properties.insert(key.to_string(), one_schema(ty));
    }
    json!({ "type": "object", "properties": properties })
}

/// The schema of one alternative: a list (`X[]`), or a scalar named by its first word.
fn one_schema(ty: &str) -> Value {
    if let Some(item) = ty.strip_suffix("[]") {
        return json!({ "type": "array", "items": one_schema(item) });
    }
    match ty.split([' ', '(']).next().unwrap_or("") {
        "string" => json!({ "type": "string" }),
        "int" => json!({ "type": "integer" }),
        "number" => json!({ "type": "number" }),
        "bool" => json!({ "type": "boolean" }),
        "object" => json!({ "type": "object" }),
        _ => json!({}),
    }
}

/// The Markdown table of `fields` that sit in `section`, as `docs/API.md` holds it.
pub fn markdown_table(fields: &[Field], section: Section) -> String {
    let mut table =
        String::from("| field | type | default | rule | clients |\n|---|---|---|---|---|\n");
    for f in fields.iter().filter(|f| f.section == section) {
        table.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            f.name,
            f.ty,
            f.default,
            one_line(f.rule),
            f.clients
        ));
    }
    table
}

/// `doc` with the table between each `<!-- fields: SECTION -->` marker and the next
/// `<!-- end fields -->` written anew from `fields`; an error names a section whose markers
/// are missing.
pub fn with_field_tables(doc: &str, fields: &[Field]) -> Result<String, String> {
    let mut out = doc.to_string();
    for section in Section::ALL {
        let open = format!("<!-- fields: {} -->\n", section.marker());
        let close = "<!-- end fields -->";
        let start = out
            .find(&open)
            .ok_or_else(|| format!("no `{}` in the document", open.trim()))?
            + open.len();
        let end = start
            + out[start..]
                .find(close)
                .ok_or_else(|| format!("no `{close}` after `{}`", open.trim()))?;
        out.replace_range(start..end, &markdown_table(fields, section));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_read_as_their_schemas() {
        assert_eq!(schema_of("int ≥ 0"), json!({"type": "integer"}));
        assert_eq!(schema_of("int (64-bit)"), json!({"type": "integer"}));
        assert_eq!(
            schema_of("string or string[]"),
            json!({"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]})
        );
        assert_eq!(
            schema_of("int[][]"),
            json!({"type": "array", "items": {"type": "array", "items": {"type": "integer"}}})
        );
        assert_eq!(
            schema_of("\"truncate\", \"error\""),
            json!({"type": "string", "enum": ["truncate", "error"]})
        );
        assert_eq!(
            schema_of("`\"truncate\"`, `\"error\"`"),
            json!({"type": "string", "enum": ["truncate", "error"]})
        );
        assert_eq!(
            schema_of("object `{\"<id>\": number}`"),
            json!({"type": "object", "additionalProperties": {"type": "number"}})
        );
        assert_eq!(
            schema_of("object `{\"a\": bool, \"b\": int}`"),
            json!({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "integer"}}})
        );
        assert_eq!(schema_of("any"), json!({}));
    }
}
