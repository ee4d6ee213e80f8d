//! A chat request: its own fields (`messages`, `tools`, the template's options) checked
//! here, and every other field through the completion validator, so that both routes
//! accept and refuse the same things with the same messages. The conversation becomes
//! the prompt later, in the route, where the model's template is.

use ferrite_protocol::{CompletionRequest, CHAT_ONLY_FIELDS, KNOWN_FIELDS, NOT_FOR_CHAT};
use serde_json::{json, Map, Value};

pub use super::constraint::ToolChoice;
use super::constraint::{
    any_call_schema, both_constrain, chosen_tools, tool_choice, tool_constraint, tool_definitions,
    tool_schema, ToolDefinition,
};
use super::{
    deserialize_naming_the_field, drop_unknown, json_object, require, FieldLimits, GenerateParams,
};
use crate::error::ApiError;
use crate::images::{image_input, ImageInput};

/// The roles a message may have. `developer` is OpenAI's newer name for `system`.
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// What the chat template renders: the conversation and its options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatInput {
    /// The messages as the template reads them: `role`, `content` (text; content parts
    /// joined), and `name`, `tool_calls` (arguments as JSON objects, as llama.cpp gives
    /// them) and `tool_call_id` where given.
    pub messages: Vec<Value>,
    /// The tools the template describes (none when `tool_choice` is `none`).
    pub tools: Vec<Value>,
    /// End with the start of the assistant's turn.
    pub add_generation_prompt: bool,
    /// Leave the last message, the assistant's, open for the model to continue.
    pub continue_final_message: bool,
    /// More variables for the template (`chat_template_kwargs`).
    pub template_kwargs: Map<String, Value>,
    /// The messages' images, in order; each stands in their text as
    /// [`CHAT_IMAGE_MARKER`].
    pub images: Vec<ImageInput>,
}

impl ChatInput {
    /// Checks a conversation and the template's options (`add_generation_prompt` defaults
    /// to true unless the last message is to be continued); no tools yet.
    pub fn new(
        messages: Value,
        add_generation_prompt: Option<bool>,
        continue_final_message: Option<bool>,
        template_kwargs: Map<String, Value>,
    ) -> Result<Self, ApiError> {
        let (messages, images) = self::messages(messages)?;
        let continue_final_message = continue_final_message.unwrap_or(false);
        let add_generation_prompt = add_generation_prompt.unwrap_or(!continue_final_message);
        if continue_final_message {
            if add_generation_prompt {
                return Err(ApiError::invalid(
                    "continue_final_message",
                    "`continue_final_message` leaves the last message open; it cannot be combined with `add_generation_prompt: true`",
                ));
            }
            if messages.last().and_then(|m| m["role"].as_str()) != Some("assistant") {
                return Err(ApiError::invalid(
                    "continue_final_message",
                    "`continue_final_message` needs the last message to be the assistant's",
                ));
            }
        }
        Ok(Self {
            messages,
            tools: Vec::new(),
            add_generation_prompt,
            continue_final_message,
            template_kwargs,
            images,
        })
    }
}

/// A validated chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatParams {
    /// Everything a completion has; its prompt is filled in once the template renders.
    pub generate: GenerateParams,
    /// What the template renders.
    pub input: ChatInput,
    /// Whether and which tool the model must call.
    pub tool_choice: ToolChoice,
    /// The tools offered, checked.
    pub tools: Vec<ToolDefinition>,
    /// Whether one answer may hold several calls.
    pub parallel_tool_calls: bool,
}

/// Parses and validates a chat request body against the API's rules and the operator's
/// `limits`.
pub fn parse_chat_body(
    body: &[u8],
    ignore_unknown: bool,
    limits: &FieldLimits,
) -> Result<ChatParams, ApiError> {
    let mut map = json_object(body)?;
    for (field, why) in NOT_FOR_CHAT {
        let asks = |v: &Value| {
            !matches!(v, Value::Null | Value::Bool(false)) && v != &json!([]) && v != ""
        };
        if map.get(*field).is_some_and(asks) {
            return Err(ApiError::invalid(
                *field,
                format!("`{field}` cannot be used in a chat request: {why}"),
            ));
        }
        map.remove(*field);
    }
    let known: Vec<&str> = KNOWN_FIELDS
        .iter()
        .copied()
        .chain(CHAT_ONLY_FIELDS.iter().map(|f| f.name))
        .collect();
    drop_unknown(&mut map, &known, ignore_unknown)?;
    require(&map, &["model", "messages"])?;
    let messages = map.remove("messages").unwrap_or_default();
    let add_generation_prompt = flag(&mut map, "add_generation_prompt")?;
    let continue_final_message = flag(&mut map, "continue_final_message")?;
    // OpenAI's: nothing is stored here, whatever `store` says, and there is one tier.
    flag(&mut map, "store")?;
    match map.remove("service_tier") {
        None | Some(Value::Null) => {}
        Some(Value::String(tier)) if tier == "auto" || tier == "default" => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "service_tier",
                "this server has one service tier: `service_tier` may be \"auto\" or \"default\"",
            ))
        }
    }
    let template_kwargs = match map.remove("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(kwargs)) => kwargs,
        Some(_) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs",
                "`chat_template_kwargs` must be an object",
            ))
        }
    };
    let mut input = ChatInput::new(
        messages,
        add_generation_prompt,
        continue_final_message,
        template_kwargs,
    )?;
    // Tools are the chat route's: their constraint takes the chat answer's shapes.
    let tools_value = map.remove("tools").filter(|v| !v.is_null());
    let choice_value = map.remove("tool_choice");
    let parallel_tool_calls = flag(&mut map, "parallel_tool_calls")?.unwrap_or(true);
    let tools_json: Vec<Value> = match tools_value {
        None => Vec::new(),
        Some(Value::Array(tools)) => tools,
        Some(_) => return Err(ApiError::invalid("tools", "`tools` must be an array")),
    };
    let tools = tool_definitions(&tools_json, limits.max_tool_name_bytes)?;
    let tool_choice = tool_choice(choice_value.as_ref(), !tools.is_empty())?;
    // Chat's `logprobs` is a switch; the number of alternatives is `top_logprobs`.
    if map
        .get("logprobs")
        .is_some_and(|v| !v.is_null() && !v.is_boolean())
    {
        return Err(ApiError::invalid(
            "logprobs",
            "`logprobs` must be true or false in a chat request; `top_logprobs` says how many alternatives",
        ));
    }
    map.insert("prompt".into(), Value::String(String::new()));
    let request: CompletionRequest = deserialize_naming_the_field(Value::Object(map))?;
    let mut generate = GenerateParams::new(request, limits)?;
    let forced = match &tool_choice {
        ToolChoice::None | ToolChoice::Auto => None,
        ToolChoice::Required => {
            let chosen = chosen_tools(&tools, &tool_choice)?;
            let one = any_call_schema(&chosen);
            let schema = if parallel_tool_calls {
                json!({"type": "array", "items": one, "minItems": 1})
            } else {
                one
            };
            Some(tool_schema(schema, &chosen)?)
        }
        ToolChoice::Named(_) => {
            let chosen = chosen_tools(&tools, &tool_choice)?;
            Some(tool_schema(chosen[0].parameters.clone(), &[])?)
        }
    };
    if let Some(schema) = forced {
        if let Some(other) = &generate.constraint {
            return Err(both_constrain(other.field, "tool_choice"));
        }
        generate.constraint = Some(tool_constraint(&schema)?);
    }
    if tool_choice != ToolChoice::None {
        input.tools = tools_json;
    }
    Ok(ChatParams {
        generate,
        input,
        tool_choice,
        tools,
        parallel_tool_calls,
    })
}

/// A boolean field, removed from the map.
fn flag(map: &mut Map<String, Value>, field: &str) -> Result<Option<bool>, ApiError> {
    match map.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(_) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be true or false"),
        )),
    }
}

/// Checks `messages` and puts each in the form the template reads, with the images
/// their content parts carry, in order.
pub fn messages(value: Value) -> Result<(Vec<Value>, Vec<ImageInput>), ApiError> {
    let Value::Array(list) = value else {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must be an array of messages",
        ));
    };
    if list.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    let mut images = Vec::new();
    let messages = list
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(i, m, &mut images))
        .collect::<Result<_, _>>()?;
    Ok((messages, images))
}

/// One message, checked and normalized; errors name `messages[i].field`.
fn message(i: usize, value: Value, images: &mut Vec<ImageInput>) -> Result<Value, ApiError> {
    let at = |field: &str| format!("messages[{i}]{field}");
    let Value::Object(m) = value else {
        return Err(ApiError::invalid(
            at(""),
            format!("`messages[{i}]` must be an object with `role` and `content`"),
        ));
    };
    let role = match m.get("role") {
        Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.as_str(),
        Some(Value::String(r)) => {
            return Err(ApiError::invalid(
                at(".role"),
                format!("`messages[{i}].role` must be one of system, developer, user, assistant, tool; got {r:?}"),
            ))
        }
        _ => {
            return Err(ApiError::invalid(
                at(".role"),
                format!("`messages[{i}].role` is required and must be a string"),
            ))
        }
    };
    let tool_calls = match m.get("tool_calls") {
        None | Some(Value::Null) => None,
        Some(Value::Array(calls)) if role == "assistant" => Some(
            calls
                .iter()
                .enumerate()
                .map(|(j, c)| tool_call(i, j, c))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(
                at(".tool_calls"),
                format!(
                    "only an assistant message may have `tool_calls` (messages[{i}] is {role})"
                ),
            ))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                at(".tool_calls"),
                format!("`messages[{i}].tool_calls` must be an array"),
            ))
        }
    };
    let content = match m.get("content") {
        Some(Value::String(text)) => text.clone(),
        // An assistant message may be only tool calls.
        None | Some(Value::Null) if role == "assistant" => String::new(),
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                at(".content"),
                format!("`messages[{i}].content` is required for a {role} message"),
            ))
        }
        Some(Value::Array(parts)) => content_parts(i, parts, role == "assistant", images)?,
        Some(_) => {
            return Err(ApiError::invalid(
                at(".content"),
                format!("`messages[{i}].content` must be a string or an array of content parts"),
            ))
        }
    };
    // `developer` is what newer OpenAI clients send for `system`; templates know `system`.
    let role = if role == "developer" { "system" } else { role };
    let mut out = Map::new();
    out.insert("role".into(), Value::String(role.into()));
    out.insert("content".into(), Value::String(content));
    for field in ["name", "tool_call_id"] {
        match m.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                out.insert(field.into(), Value::String(s.clone()));
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    at(&format!(".{field}")),
                    format!("`messages[{i}].{field}` must be a string"),
                ))
            }
        }
    }
    if role == "tool" && !out.contains_key("tool_call_id") {
        return Err(ApiError::invalid(
            at(".tool_call_id"),
            format!("a tool message needs `tool_call_id` (messages[{i}])"),
        ));
    }
    if let Some(calls) = tool_calls {
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    Ok(Value::Object(out))
}

/// The marker an image part leaves in a message's text for the template to place: random
/// per process (as llama-server's), so that no client can write one into its text.
pub static CHAT_IMAGE_MARKER: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use rand::Rng;
    let mut rng = rand::rng();
    let tail: String = (0..24)
        .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)]))
        .collect();
    format!("<__image_{tail}__>")
});

/// A message's content parts as the template reads them: text parts joined by newlines
/// (as vLLM and llama-server join them), each image part [`CHAT_IMAGE_MARKER`] with no
/// newline on either side (llama-server's flattening) and its bytes added to `images`.
/// Audio, video and files are a 400.
fn content_parts(
    i: usize,
    parts: &[Value],
    assistant: bool,
    images: &mut Vec<ImageInput>,
) -> Result<String, ApiError> {
    let mut text = String::new();
    let mut after_text = false;
    for (j, part) in parts.iter().enumerate() {
        let param = format!("messages[{i}].content[{j}]");
        match part.get("type").and_then(Value::as_str) {
            Some("text") => match part.get("text") {
                Some(Value::String(t)) => {
                    if after_text {
                        text.push('\n');
                    }
                    text.push_str(t);
                    after_text = true;
                }
                _ => {
                    return Err(ApiError::invalid(
                        param.clone(),
                        format!("`{param}.text` must be a string"),
                    ))
                }
            },
            // An assistant's refusal, as SDKs copy it back from an answer: not text to render.
            Some("refusal") if assistant => {}
            Some(kind @ ("image_url" | "input_image")) => {
                let url = image_url(part, kind).ok_or_else(|| {
                    ApiError::invalid(
                        param.clone(),
                        format!("`{param}.{kind}` must be a URL string or an object with `url`"),
                    )
                })?;
                images.push(image_input(&param, url)?);
                text.push_str(&CHAT_IMAGE_MARKER);
                after_text = false;
            }
            Some(kind @ ("image" | "input_audio" | "audio_url" | "video_url" | "file")) => {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "a `{kind}` content part cannot be used here: images come as \
                         `image_url` parts, and the model reads text and images only"
                    ),
                ))
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "content parts must have type \"text\" or \"image_url\", got {other:?}"
                    ),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    param.clone(),
                    format!("`{param}` must be an object with a `type`"),
                ))
            }
        }
    }
    Ok(text)
}

/// The URL of an image part: `image_url` as a string or `{url, detail}` (OpenAI's chat
/// API), `input_image`'s `image_url` string (its Responses API).
fn image_url<'a>(part: &'a Value, kind: &str) -> Option<&'a str> {
    match &part[kind] {
        Value::String(url) => Some(url),
        Value::Object(o) => o.get("url").and_then(Value::as_str),
        _ => part.get("image_url").and_then(Value::as_str),
    }
}

/// One of an assistant message's `tool_calls`: `{"id", "type": "function", "function":
/// {"name", "arguments"}}`; arguments given as JSON text become the object they spell,
/// as llama.cpp passes them to templates.
fn tool_call(i: usize, j: usize, call: &Value) -> Result<Value, ApiError> {
    let param = format!("messages[{i}].tool_calls[{j}]");
    let bad = |what: &str| ApiError::invalid(param.clone(), format!("`{param}` {what}"));
    let function = call
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("needs a `function` object"))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("needs `function.name`"))?;
    let arguments = match function.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(text)) => {
            serde_json::from_str::<Value>(text).unwrap_or_else(|_| Value::String(text.clone()))
        }
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => {
            return Err(bad(
                "has `function.arguments` that is neither JSON text nor an object",
            ))
        }
    };
    let mut out = json!({
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    });
    if let Some(id) = call.get("id").and_then(Value::as_str) {
        out["id"] = Value::String(id.into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::tests::param_of;

    fn parse(body: &str) -> Result<ChatParams, ApiError> {
        parse_chat_body(body.as_bytes(), false, &FieldLimits::DEFAULT)
    }

    fn with(extra: &str) -> String {
        format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#)
    }

    #[test]
    fn a_plain_request_resolves() {
        let p = parse(&with("")).unwrap();
        assert_eq!(p.input.messages, [json!({"role": "user", "content": "hi"})]);
        assert!(p.input.add_generation_prompt && !p.input.continue_final_message);
        assert_eq!(p.generate.max_tokens, None);
        assert_eq!(p.tool_choice, ToolChoice::None);
        let p = parse(&with(
            r#","logprobs":true,"top_logprobs":3,"max_completion_tokens":7,"n":2,"store":false,"service_tier":"auto","functions":null"#,
        ))
        .unwrap();
        assert_eq!(p.generate.output.logprobs, Some(3));
        assert_eq!((p.generate.max_tokens, p.generate.n), (Some(7), 2));
    }

    #[test]
    fn messages_are_normalized_for_the_template() {
        let p = parse(
            r#"{"model":"m","messages":[
                {"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                {"role":"user","content":"q","name":"ann","refusal":null},
                {"role":"assistant","content":[{"type":"refusal","refusal":"no"},{"type":"text","text":"ok"}]},
                {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}]},
                {"role":"tool","tool_call_id":"c1","content":"2"}]}"#,
        )
        .unwrap();
        assert_eq!(
            p.input.messages,
            [
                json!({"role": "system", "content": "a\nb"}),
                json!({"role": "user", "content": "q", "name": "ann"}),
                json!({"role": "assistant", "content": "ok"}),
                json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}, "id": "c1"}]}),
                json!({"role": "tool", "content": "2", "tool_call_id": "c1"}),
            ]
        );
    }

    #[test]
    fn errors_name_their_field() {
        let cases = [
            (r#"{"model":"m"}"#, "messages"),
            (r#"{"model":"m","messages":[]}"#, "messages"),
            (r#"{"model":"m","messages":"hi"}"#, "messages"),
            (r#"{"model":"m","messages":[5]}"#, "messages[0]"),
            (
                r#"{"model":"m","messages":[{"content":"x"}]}"#,
                "messages[0].role",
            ),
            (
                r#"{"model":"m","messages":[{"role":"wizard","content":"x"}]}"#,
                "messages[0].role",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user"}]}"#,
                "messages[0].content",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
                "messages[0].content",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:"}}]}]}"#,
                "messages[0].content[0]",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}"#,
                "messages[0].content[0]",
            ),
            (
                r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#,
                "messages[0].tool_call_id",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x","tool_calls":[]}]}"#,
                "messages[0].tool_calls",
            ),
            (
                r#"{"model":"m","messages":[{"role":"assistant","content":"x","tool_calls":[{"type":"function"}]}]}"#,
                "messages[0].tool_calls[0]",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x","name":3}]}"#,
                "messages[0].name",
            ),
            (r#"{"messages":[{"role":"user","content":"x"}]}"#, "model"),
        ];
        for (body, field) in cases {
            let err = parse(body).expect_err(body);
            assert_eq!(param_of(err), Some(field.to_string()), "{body}");
        }
        for (extra, field) in [
            (r#","prompt":"x""#, "prompt"),
            (r#","echo":true"#, "echo"),
            (r#","suffix":"x""#, "suffix"),
            (r#","logprobs":3"#, "logprobs"),
            (r#","top_logprobs":2"#, "top_logprobs"),
            (r#","temperature":9"#, "temperature"),
            (r#","bogus":1"#, "bogus"),
            (r#","add_generation_prompt":"yes""#, "add_generation_prompt"),
            (
                r#","continue_final_message":true"#,
                "continue_final_message",
            ),
            (r#","chat_template_kwargs":[1]"#, "chat_template_kwargs"),
            (r#","tools":{}"#, "tools"),
            (r#","tools":[{"type":"function","function":{}}]"#, "tools"),
            (
                r#","tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]"#,
                "tools",
            ),
            (r#","tool_choice":"required""#, "tool_choice"),
            (r#","tool_choice":"auto""#, "tool_choice"),
            (r#","tools":[],"tool_choice":"auto""#, "tool_choice"),
            (
                r#","tool_choice":{"type":"function","function":{"name":"f"}}"#,
                "tool_choice",
            ),
            (r#","tool_choice":"sometimes""#, "tool_choice"),
            (
                r#","tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}"#,
                "tool_choice",
            ),
            (
                r#","tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required","response_format":{"type":"json_object"}"#,
                "tool_choice",
            ),
            (r#","parallel_tool_calls":"x""#, "parallel_tool_calls"),
            (r#","store":"yes""#, "store"),
            (r#","service_tier":"flex""#, "service_tier"),
            (r#","functions":[{"name":"f"}]"#, "functions"),
            (r#","function_call":"auto""#, "function_call"),
            (r#","reasoning_effort":"low""#, "reasoning_effort"),
        ] {
            let body = with(extra);
            let err = parse(&body).expect_err(&body);
            assert_eq!(param_of(err), Some(field.to_string()), "{body}");
        }
    }

    #[test]
    fn tool_choices_constrain_to_calls() {
        let tools = r#","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}},{"type":"function","function":{"name":"g"}}]"#;
        let auto = parse(&with(tools)).unwrap();
        assert_eq!(
            (auto.tool_choice, auto.generate.constraint),
            (ToolChoice::Auto, None)
        );
        assert_eq!(auto.input.tools.len(), 2);
        let none = parse(&with(&format!(r#"{tools},"tool_choice":"none""#))).unwrap();
        assert!(none.input.tools.is_empty() && none.generate.constraint.is_none());
        let schema = |p: ChatParams| -> Value {
            serde_json::from_str(&p.generate.constraint.unwrap().grammar.source).unwrap()
        };
        let required =
            schema(parse(&with(&format!(r#"{tools},"tool_choice":"required""#))).unwrap());
        assert_eq!(required["type"], "array");
        assert_eq!(
            required["items"]["anyOf"][1]["properties"]["name"]["const"],
            "g"
        );
        let single = schema(
            parse(&with(&format!(
                r#"{tools},"tool_choice":"required","parallel_tool_calls":false"#
            )))
            .unwrap(),
        );
        assert_eq!(single["anyOf"][0]["properties"]["name"]["const"], "f");
        let named = schema(
            parse(&with(&format!(
                r#"{tools},"tool_choice":{{"type":"function","function":{{"name":"f"}}}}"#
            )))
            .unwrap(),
        );
        assert_eq!(named["properties"]["x"]["type"], "integer");
    }

    #[test]
    fn continuing_the_last_message() {
        let p = parse(
            r#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hel"}],"continue_final_message":true}"#,
        )
        .unwrap();
        assert!(p.input.continue_final_message && !p.input.add_generation_prompt);
    }
}
