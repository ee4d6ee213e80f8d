//! Chat templates: a model's Jinja chat template (its GGUF's `tokenizer.chat_template`, or
//! one the operator gives) rendered over a conversation into the prompt text the model was
//! trained on, as Hugging Face's `apply_chat_template` and llama.cpp's server render it.
//!
//! The templates are written for Python's Jinja2 as `transformers` runs it, so they are
//! rendered here the same way: blocks trimmed (`trim_blocks`, `lstrip_blocks`), Python's
//! string and dict methods (`strip`, `startswith`, `items`, … through minijinja's
//! `pycompat`), `tojson` writing JSON as Python's `json.dumps` does, and the globals the
//! templates expect (`bos_token`, `eos_token`, `add_generation_prompt`, `messages`,
//! `tools`, `raise_exception`, `strftime_now`). A template's error, raised or not, is a
//! [`TemplateError`] with its message: the caller answers the client with it.
//!
//! A model without a template gets [`CHATML`], as llama.cpp's server gives it.

#![deny(missing_docs)]

mod pyjson;
pub mod tools;

use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;

/// The template a model without one gets: ChatML, llama.cpp's server's default.
pub const CHATML: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}";

/// The template's name in error messages.
const NAME: &str = "chat_template";

/// Instructions one rendering may run: far more than any real template needs for a
/// conversation within the server's body limit, and a bound on a template that loops.
const FUEL: u64 = 50_000_000;

/// A template's failure to compile or render, with its message (and line, where known).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(String);

impl From<Error> for TemplateError {
    fn from(e: Error) -> Self {
        let mut message = match (e.kind(), e.detail()) {
            // raise_exception's message as the template wrote it.
            (ErrorKind::InvalidOperation, Some(detail)) => detail.to_string(),
            (kind, Some(detail)) => format!("{kind}: {detail}"),
            (kind, None) => kind.to_string(),
        };
        if let Some(line) = e.line() {
            message.push_str(&format!(" (chat template line {line})"));
        }
        Self(message)
    }
}

/// The special tokens a template sees, and whether the tokenizer adds them itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// The beginning-of-sequence token's text (`bos_token`).
    pub bos: String,
    /// The end-of-sequence token's text (`eos_token`).
    pub eos: String,
    /// Whether tokenizing the prompt adds the BOS token: a rendered prompt that begins
    /// with it loses it, so that it is not there twice (llama.cpp does the same).
    pub add_bos: bool,
    /// Whether tokenizing adds the EOS token: a rendered prompt that ends with it loses it.
    pub add_eos: bool,
}

/// What one rendering takes.
#[derive(Debug, Clone, Copy)]
pub struct Conversation<'a> {
    /// The messages, each a JSON object (`role`, `content`, and whatever else the client
    /// sent that the template may read: `name`, `tool_calls`, `tool_call_id`).
    pub messages: &'a [Json],
    /// The tools the client offers (their JSON definitions), if any: `tools` is `none` in
    /// the template otherwise.
    pub tools: Option<&'a [Json]>,
    /// Whether to end with the start of the assistant's turn.
    pub add_generation_prompt: bool,
    /// More variables for the template (vLLM's `chat_template_kwargs`, such as Qwen 3's
    /// `enable_thinking`); they cannot replace the ones above.
    pub extra: Option<&'a serde_json::Map<String, Json>>,
}

/// Bytes one rendering may write unless [`ChatTemplate::limit_output`] says otherwise.
pub const DEFAULT_MAX_OUTPUT: usize = 16 << 20;

/// A compiled chat template and the special tokens it renders with.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    tokens: SpecialTokens,
    /// Most bytes one rendering may write.
    max_output: usize,
}

impl ChatTemplate {
    /// Compiles `source`, or names its syntax error.
    pub fn new(source: &str, tokens: SpecialTokens) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", pyjson::tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.to_string())?;
        Ok(Self {
            env,
            tokens,
            max_output: DEFAULT_MAX_OUTPUT,
        })
    }

    /// Makes a rendering that would write more than `bytes` an error: fuel bounds a
    /// template's instructions, not what they write (a loop over a client's number, each
    /// turn writing a message of megabytes).
    pub fn limit_output(&mut self, bytes: usize) {
        self.max_output = bytes;
    }

    /// The prompt text of `conversation`.
    pub fn render(&self, conversation: &Conversation) -> Result<String, TemplateError> {
        let template = self.env.get_template(NAME)?;
        // `none` without tools, as transformers passes them: templates test `tools is not none`.
        let tools = conversation.tools.filter(|t| !t.is_empty());
        let context = minijinja::context! {
            messages => Value::from_serialize(conversation.messages),
            bos_token => &self.tokens.bos,
            eos_token => &self.tokens.eos,
            add_generation_prompt => conversation.add_generation_prompt,
            tools => tools.map(Value::from_serialize),
            ..Value::from_serialize(conversation.extra)
        };
        let mut out = Bounded {
            text: Vec::new(),
            limit: self.max_output,
            over: false,
        };
        if let Err(e) = template.render_captured_to(context, &mut out) {
            if out.over {
                return Err(TemplateError(format!(
                    "the chat template's output would pass {} bytes, the most this server renders",
                    self.max_output
                )));
            }
            return Err(e.into());
        }
        let mut text = String::from_utf8(out.text)
            .map_err(|_| TemplateError("the chat template wrote invalid UTF-8".into()))?;
        let (bos, eos) = (&self.tokens.bos, &self.tokens.eos);
        if self.tokens.add_bos && !bos.is_empty() && text.starts_with(bos.as_str()) {
            text.drain(..bos.len());
        }
        if self.tokens.add_eos && !eos.is_empty() && text.ends_with(eos.as_str()) {
            text.truncate(text.len() - eos.len());
        }
        Ok(text)
    }
}

/// A rendering's output, refusing to grow past `limit` bytes.
struct Bounded {
    text: Vec<u8>,
    limit: usize,
    /// The limit was reached (the text is then dropped).
    over: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + bytes.len() > self.limit {
            self.text = Vec::new();
            self.over = true;
            return Err(std::io::Error::other("the output limit is reached"));
        }
        self.text.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `raise_exception(message)`: the template refuses the conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the local time, as Python's `datetime.now().strftime`.
fn strftime_now(format: String) -> Result<Value, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        ));
    }
    let now = chrono::Local::now();
    Ok(Value::from(
        now.format_with_items(items.into_iter()).to_string(),
    ))
}

#[cfg(test)]
mod tests;
