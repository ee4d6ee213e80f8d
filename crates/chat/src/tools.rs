//! Tool calls: how a model writes them, what to tell a model whose template does not
//! describe tools, and the calls read back out of its output.
//!
//! Templates that render `tools` teach the model one syntax; ferrite reads the one the
//! template teaches ([`ToolSyntax::of_template`]):
//! - Hermes tags, `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Qwen 2.5 and 3,
//!   Hermes, and the instructions ferrite adds for a template without tools);
//! - a bare JSON object `{"name": …, "parameters": {…}}` (Llama 3.1–3.3), maybe after
//!   `<|python_tag|>`, several separated by `;`;
//! - `[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}` (Mistral).
//!
//! A template that never mentions `tools` would drop them: the conversation gets a system
//! message describing them in the Hermes syntax instead ([`describe_tools`]), as
//! llama.cpp's server does for such templates with its generic format.
//!
//! [`ToolStream`] reads output as it comes: text that cannot be part of a call passes
//! through at once, a call is held until it is complete. A call that does not parse stays
//! text, so nothing the model wrote is lost.

use serde_json::{json, Map, Value as Json};

/// Where a Hermes call begins.
pub const HERMES_OPEN: &str = "<tool_call>";
/// Where a Hermes call ends.
pub const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_TAG: &str = "[TOOL_CALLS]";

/// How a model writes its tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, anywhere in the output.
    Hermes,
    /// The whole output is `{"name": …, "parameters": {…}}` (or `arguments`), maybe after
    /// `<|python_tag|>`; several calls are separated by `;` or given as an array.
    JsonObject,
    /// `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`.
    Mistral,
}

/// What a template does with tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSupport {
    /// The syntax the model is taught.
    pub syntax: ToolSyntax,
    /// Whether the template renders `tools` itself; if not, [`describe_tools`] tells the
    /// model about them.
    pub template_renders_tools: bool,
}

impl ToolSyntax {
    /// The text that marks a call in this syntax (which may be one special token of a
    /// vocabulary).
    pub fn marker(self) -> &'static str {
        match self {
            ToolSyntax::Hermes => HERMES_OPEN,
            ToolSyntax::JsonObject => PYTHON_TAG,
            ToolSyntax::Mistral => MISTRAL_TAG,
        }
    }

    /// The syntax `source` (a chat template) teaches, and whether it renders tools.
    pub fn of_template(source: &str) -> ToolSupport {
        let renders = source.contains("tools");
        let syntax = if !renders || source.contains(HERMES_OPEN) {
            ToolSyntax::Hermes
        } else if source.contains(MISTRAL_TAG) {
            ToolSyntax::Mistral
        } else {
            ToolSyntax::JsonObject
        };
        ToolSupport {
            syntax,
            template_renders_tools: renders,
        }
    }
}

/// One call read from the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, as JSON text (an object).
    pub arguments: String,
}

/// Output split into text and calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedOutput {
    /// The text that is not a call (`None` when there is none beside calls).
    pub content: Option<String>,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
}

impl ParsedOutput {
    /// This end of an output after the text `early` that already went out: the whole
    /// output's content, trimmed when it stands beside calls (`None` when empty).
    pub fn after(mut self, early: &str) -> Self {
        let content = format!("{early}{}", self.content.take().unwrap_or_default());
        let content = if self.calls.is_empty() {
            content
        } else {
            content.trim().to_string()
        };
        self.content = Some(content).filter(|c| !c.is_empty());
        self
    }
}

/// The system message that describes `tools` to a model whose template does not, in the
/// Hermes syntax that [`ToolStream`] reads back.
pub fn describe_tools(tools: &[Json]) -> String {
    let mut text = String::from(
        "You may call one or more functions to help with the user's request. \
         The functions are described as JSON within <tools></tools> tags:\n<tools>\n",
    );
    for tool in tools {
        text.push_str(&tool.to_string());
        text.push('\n');
    }
    text.push_str(
        "</tools>\n\nTo call a function, write a JSON object with its name and arguments \
         within <tool_call></tool_call> tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    text
}

/// `messages` for a template that does not render tools: the tools (if any) described
/// after the first message's text when it is a system message (in a system message
/// added first otherwise), and the assistant's earlier calls written into its content in
/// the syntax the description teaches, whether or not tools are offered now (the
/// template would drop them).
pub fn with_tools_described(messages: &[Json], tools: &[Json]) -> Vec<Json> {
    let description = (!tools.is_empty()).then(|| describe_tools(tools));
    let mut out = Vec::with_capacity(messages.len() + 1);
    let first_is_system = messages
        .first()
        .is_some_and(|m| m.get("role").and_then(Json::as_str) == Some("system"));
    if let Some(description) = description.as_ref().filter(|_| !first_is_system) {
        out.push(json!({"role": "system", "content": description}));
    }
    for (i, message) in messages.iter().enumerate() {
        let mut message = message.clone();
        let Some(map) = message.as_object_mut() else {
            out.push(message);
            continue;
        };
        if let Some(description) = description.as_ref().filter(|_| i == 0 && first_is_system) {
            let content = map.get("content").and_then(Json::as_str).unwrap_or("");
            let joined = format!("{content}\n\n{description}");
            map.insert(
                "content".into(),
                Json::String(joined.trim_start().to_string()),
            );
        }
        if let Some(Json::Array(calls)) = map.remove("tool_calls") {
            let mut content = map
                .get("content")
                .and_then(Json::as_str)
                .unwrap_or("")
                .to_string();
            for call in &calls {
                let function = call.get("function").unwrap_or(call);
                let written = json!({
                    "name": function.get("name").cloned().unwrap_or(Json::Null),
                    "arguments": function.get("arguments").cloned().unwrap_or(json!({})),
                });
                if !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(&format!("{HERMES_OPEN}\n{written}\n{HERMES_CLOSE}"));
            }
            map.insert("content".into(), Json::String(content));
        }
        out.push(message);
    }
    out
}

/// A call from its JSON: `{"name": string, "arguments" | "parameters": object or JSON
/// text of one}`.
fn call_of(value: &Json) -> Option<ParsedCall> {
    let map = value.as_object()?;
    let name = map.get("name")?.as_str()?.to_string();
    let arguments = match map.get("arguments").or_else(|| map.get("parameters")) {
        None | Some(Json::Null) => Json::Object(Map::new()),
        Some(Json::String(text)) => serde_json::from_str::<Json>(text).ok()?,
        Some(other) => other.clone(),
    };
    if !arguments.is_object() {
        return None;
    }
    Some(ParsedCall {
        name,
        arguments: arguments.to_string(),
    })
}

/// Calls from JSON text holding one call `{"name", "arguments"}` or an array of them
/// (`None` when it is not that).
pub fn parse_json_calls(text: &str) -> Option<Vec<ParsedCall>> {
    calls_of(&serde_json::from_str::<Json>(text.trim()).ok()?)
}

/// The calls a JSON value holds: one call, or a non-empty array of them.
fn calls_of(value: &Json) -> Option<Vec<ParsedCall>> {
    match value {
        Json::Array(items) if !items.is_empty() => items.iter().map(call_of).collect(),
        value => call_of(value).map(|c| vec![c]),
    }
}

/// Hermes calls in `text` (which begins with the first `<tool_call>`): the calls and
/// the text between and after them, or `None` when a call does not parse. Each call is
/// one JSON value read as JSON (so a `</tool_call>` inside one of its strings is text),
/// then its closing tag, which may be missing at the very end (a stop string took it).
fn hermes_calls(text: &str) -> Option<(Vec<ParsedCall>, String)> {
    let mut calls = Vec::new();
    let mut rest = String::new();
    let mut tail = text;
    while let Some(start) = tail.find(HERMES_OPEN) {
        rest.push_str(&tail[..start]);
        let body = tail[start + HERMES_OPEN.len()..].trim_start();
        let mut values = serde_json::Deserializer::from_str(body).into_iter::<Json>();
        let value = values.next()?.ok()?;
        let after = body[values.byte_offset()..].trim_start();
        calls.extend(calls_of(&value)?);
        tail = match after.strip_prefix(HERMES_CLOSE) {
            Some(after) => after,
            None if after.is_empty() => after,
            None => return None,
        };
    }
    rest.push_str(tail);
    Some((calls, rest))
}

/// Calls of the whole-output syntaxes, or `None` when the text is not one.
fn whole_output_calls(syntax: ToolSyntax, text: &str) -> Option<Vec<ParsedCall>> {
    let text = text.trim();
    match syntax {
        ToolSyntax::Hermes => None,
        ToolSyntax::Mistral => parse_json_calls(text.strip_prefix(MISTRAL_TAG)?),
        ToolSyntax::JsonObject => {
            let text = text.strip_prefix(PYTHON_TAG).unwrap_or(text);
            parse_json_calls(text).or_else(|| {
                text.split(';')
                    .filter(|part| !part.trim().is_empty())
                    .map(|part| {
                        parse_json_calls(part)
                            .filter(|c| c.len() == 1)
                            .map(|mut c| c.remove(0))
                    })
                    .collect::<Option<Vec<_>>>()
                    .filter(|calls| !calls.is_empty())
            })
        }
    }
}

/// Reads a choice's output as it comes: what cannot be part of a call goes out at once
/// ([`ToolStream::push`]), a possible call is held to the end ([`ToolStream::finish`]).
#[derive(Debug, Clone)]
pub struct ToolStream {
    syntax: ToolSyntax,
    /// Text held back: a call, or what may still become one.
    held: String,
    /// Whether a call has begun (Hermes), or the output may be a call (the others).
    holding_all: bool,
    /// Whether the output can no longer be a call (the whole-output syntaxes).
    passing: bool,
}

impl ToolStream {
    /// A reader for `syntax`.
    pub fn new(syntax: ToolSyntax) -> Self {
        Self {
            syntax,
            held: String::new(),
            holding_all: false,
            passing: false,
        }
    }

    /// Takes new output; returns the text that can go out now.
    pub fn push(&mut self, text: &str) -> String {
        if self.passing {
            return text.to_string();
        }
        self.held.push_str(text);
        if self.holding_all {
            return String::new();
        }
        match self.syntax {
            ToolSyntax::Hermes => {
                if let Some(start) = self.held.find(HERMES_OPEN) {
                    self.holding_all = true;
                    let call = self.held.split_off(start);
                    return std::mem::replace(&mut self.held, call);
                }
                // Keep back what may be the start of the tag.
                let keep = longest_prefix_suffix(&self.held, HERMES_OPEN);
                let out = self.held[..self.held.len() - keep].to_string();
                self.held.drain(..self.held.len() - keep);
                out
            }
            ToolSyntax::JsonObject | ToolSyntax::Mistral => {
                let start = self.held.trim_start();
                if start.is_empty() {
                    return String::new();
                }
                let markers: &[&str] = match self.syntax {
                    ToolSyntax::Mistral => &[MISTRAL_TAG],
                    _ => &["{", "[", PYTHON_TAG],
                };
                let may_be_call = markers
                    .iter()
                    .any(|m| start.starts_with(m) || m.starts_with(start));
                if may_be_call {
                    if markers.iter().any(|m| start.starts_with(m)) {
                        self.holding_all = true;
                    }
                    String::new()
                } else {
                    self.passing = true;
                    std::mem::take(&mut self.held)
                }
            }
        }
    }

    /// The end of the output: the calls held back, and the text that is not a call among
    /// what was held. A call that does not parse is given back as text.
    pub fn finish(self) -> ParsedOutput {
        let held = self.held;
        let parsed = match self.syntax {
            ToolSyntax::Hermes => hermes_calls(&held),
            _ => whole_output_calls(self.syntax, &held).map(|calls| (calls, String::new())),
        };
        match parsed {
            Some((calls, rest)) if !calls.is_empty() => ParsedOutput {
                content: Some(rest.trim().to_string()).filter(|t| !t.is_empty()),
                calls,
            },
            _ => ParsedOutput {
                content: Some(held).filter(|t| !t.is_empty()),
                calls: Vec::new(),
            },
        }
    }
}

/// The longest suffix of `text` that is a proper prefix of `tag`, in bytes.
fn longest_prefix_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// Splits a whole output into text and calls, as [`ToolStream`] does piece by piece.
pub fn parse_output(syntax: ToolSyntax, text: &str) -> ParsedOutput {
    let mut stream = ToolStream::new(syntax);
    let early = stream.push(text);
    stream.finish().after(&early)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn the_template_says_which_syntax() {
        let hermes = ToolSyntax::of_template("{% if tools %}<tools>{% endif %}<tool_call>");
        assert_eq!(hermes.syntax, ToolSyntax::Hermes);
        assert!(hermes.template_renders_tools);
        let llama = ToolSyntax::of_template("{% if tools is not none %}{{ tools | tojson }}");
        assert_eq!(llama.syntax, ToolSyntax::JsonObject);
        let mistral = ToolSyntax::of_template("{{ tools }}[TOOL_CALLS]");
        assert_eq!(mistral.syntax, ToolSyntax::Mistral);
        let none = ToolSyntax::of_template(crate::CHATML);
        assert_eq!(none.syntax, ToolSyntax::Hermes);
        assert!(!none.template_renders_tools);
    }

    #[test]
    fn hermes_calls_come_out_of_text() {
        let out = parse_output(
            ToolSyntax::Hermes,
            "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>",
        );
        assert_eq!(out.content.as_deref(), Some("Let me look."));
        assert_eq!(
            out.calls,
            [call("get_weather", r#"{"city":"Paris"}"#), call("f", "{}")]
        );
        // Without the closing tag (cut by a stop string), the call still counts.
        let out = parse_output(
            ToolSyntax::Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": {}}",
        );
        assert_eq!((out.content, out.calls), (None, vec![call("f", "{}")]));
    }

    #[test]
    fn a_closing_tag_inside_an_argument_is_text() {
        let out = parse_output(
            ToolSyntax::Hermes,
            "<tool_call>{\"name\": \"echo\", \"arguments\": {\"s\": \"a</tool_call>b\"}}</tool_call> done",
        );
        assert_eq!(out.calls, [call("echo", r#"{"s":"a</tool_call>b"}"#)]);
        assert_eq!(out.content.as_deref(), Some("done"));
        // Text between a call and its closing tag: not a call.
        let text = "<tool_call>{\"name\": \"f\", \"arguments\": {}} oops</tool_call>";
        assert_eq!(
            parse_output(ToolSyntax::Hermes, text).content.as_deref(),
            Some(text)
        );
    }

    #[test]
    fn what_is_not_a_call_stays_text() {
        for text in [
            "Plain words.",
            "<tool_call>{\"name\": 5}</tool_call>",
            "<tool_call>{not json</tool_call>",
            "x <tool_call",
        ] {
            let out = parse_output(ToolSyntax::Hermes, text);
            assert_eq!(out.content.as_deref(), Some(text), "{text}");
            assert!(out.calls.is_empty());
        }
        let out = parse_output(ToolSyntax::JsonObject, "{\"a\": 1} is an object");
        assert_eq!(out.content.as_deref(), Some("{\"a\": 1} is an object"));
    }

    #[test]
    fn llama3_and_mistral_calls() {
        let out = parse_output(
            ToolSyntax::JsonObject,
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}; {\"name\": \"g\", \"parameters\": {}}",
        );
        assert_eq!(out.calls, [call("f", r#"{"x":1}"#), call("g", "{}")]);
        assert_eq!(out.content, None);
        let out = parse_output(
            ToolSyntax::Mistral,
            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"x\": \"y\"}}]",
        );
        assert_eq!(out.calls, [call("f", r#"{"x":"y"}"#)]);
        let out = parse_output(ToolSyntax::Mistral, "No call here.");
        assert_eq!(out.content.as_deref(), Some("No call here."));
    }

    #[test]
    fn a_stream_lets_text_out_and_holds_calls() {
        let mut s = ToolStream::new(ToolSyntax::Hermes);
        assert_eq!(s.push("Sure"), "Sure");
        // "<tool" may begin the tag: held back.
        assert_eq!(s.push(", <tool"), ", ");
        assert_eq!(s.push("_call>{\"name\": \"f\", "), "");
        assert_eq!(s.push("\"arguments\": {}}</tool_call>"), "");
        let out = s.finish();
        assert_eq!((out.content, out.calls), (None, vec![call("f", "{}")]));
        // A held "<to" that goes elsewhere comes out.
        let mut s = ToolStream::new(ToolSyntax::Hermes);
        assert_eq!(s.push("a <to"), "a ");
        assert_eq!(s.push("day"), "<today");
        assert_eq!(s.finish(), ParsedOutput::default());
        // The whole-output syntaxes decide at the first character that is not space.
        let mut s = ToolStream::new(ToolSyntax::JsonObject);
        assert_eq!(s.push("  "), "");
        assert_eq!(s.push("Hello"), "  Hello");
        assert_eq!(s.push(" {"), " {");
        let mut s = ToolStream::new(ToolSyntax::JsonObject);
        assert_eq!(s.push("<|pyth"), "");
        assert_eq!(s.push("on_tag|>{\"name\": \"f\", \"parameters\": {}}"), "");
        assert_eq!(s.finish().calls, [call("f", "{}")]);
    }

    #[test]
    fn held_text_is_cut_on_character_boundaries() {
        let mut s = ToolStream::new(ToolSyntax::Hermes);
        assert_eq!(s.push("é<"), "é");
        assert_eq!(s.push("€"), "<€");
    }

    #[test]
    fn tools_are_described_to_a_template_without_them() {
        let tools = [json!({"type": "function", "function": {"name": "f"}})];
        let messages = [
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}),
            json!({"role": "tool", "tool_call_id": "1", "content": "42"}),
        ];
        let out = with_tools_described(&messages, &tools);
        assert_eq!(out.len(), 4);
        assert_eq!(out[0]["role"], "system");
        assert!(out[0]["content"]
            .as_str()
            .unwrap()
            .contains("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"f\"}}\n</tools>"));
        assert_eq!(
            out[2]["content"],
            "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"x\":1}}\n</tool_call>"
        );
        assert!(out[2].get("tool_calls").is_none());
        // Without tools, earlier calls are still written out.
        let history = with_tools_described(&messages, &[]);
        assert_eq!(history.len(), 3);
        assert_eq!(history[1]["content"], out[2]["content"]);
        let with_system = with_tools_described(
            &[
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "hi"}),
            ],
            &tools,
        );
        assert_eq!(with_system.len(), 2);
        assert!(with_system[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("Be brief.\n\nYou may call"));
    }
}
