//! The served model's chat template: chosen once at start-up (the operator's
//! `--chat-template` file, else the model's own, else ChatML), then rendered over each
//! chat request's conversation into its prompt.

use ferrite_chat::tools::{with_tools_described, ToolSupport, ToolSyntax};
use ferrite_chat::{ChatTemplate, Conversation, SpecialTokens, CHATML};
use ferrite_engine::tokenizer::Tokenizer;

use crate::error::ApiError;
use crate::validate::{ChatInput, PromptInput};

/// Where the template came from, for the logs and `/tokenizer_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateOrigin {
    /// `--chat-template FILE`.
    File,
    /// The model file's `tokenizer.chat_template`.
    Model,
    /// ChatML, for a model without a template (as llama.cpp's server does).
    Default,
}

impl TemplateOrigin {
    /// A word for the logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Model => "model",
            Self::Default => "chatml-default",
        }
    }
}

/// The compiled template and what it does with tools.
#[derive(Debug)]
pub struct ChatSetup {
    template: ChatTemplate,
    /// The template's source, as `/tokenizer_info` gives it.
    pub source: String,
    /// The tool-call syntax it teaches and whether it renders tools itself.
    pub tools: ToolSupport,
    /// Where it came from.
    pub origin: TemplateOrigin,
    /// Text that ends the assistant's turn but is no token of the vocabulary, so that no
    /// end-of-generation token can end it: ChatML's `<|im_end|>`, for a model that got
    /// the default template. The chat route stops at it.
    pub end_of_turn: Option<&'static str>,
    /// Whether control-token text in what clients write (messages, tools, template
    /// variables) becomes control tokens (`--special-tokens-in-messages`). Off: it stays
    /// text, and only the template's own markers are control tokens.
    pub special_tokens_in_messages: bool,
}

impl ChatSetup {
    /// The template for a model with `tokenizer`: `file` (its source) first, then the
    /// model's own, then ChatML. An error names the template that does not compile.
    pub fn new(tokenizer: &Tokenizer, file: Option<&str>) -> Result<Self, String> {
        let (source, origin) = match (file, tokenizer.chat_template()) {
            (Some(source), _) => (source, TemplateOrigin::File),
            (None, Some(source)) => (source, TemplateOrigin::Model),
            (None, None) => (CHATML, TemplateOrigin::Default),
        };
        let text = |id: Option<u32>| {
            id.and_then(|id| tokenizer.piece(id))
                .unwrap_or_default()
                .to_string()
        };
        let tokens = SpecialTokens {
            bos: text(tokenizer.bos()),
            eos: text(tokenizer.eos()),
            add_bos: tokenizer.adds_bos(),
            add_eos: false,
        };
        let template = ChatTemplate::new(source, tokens)
            .map_err(|e| format!("the {} chat template does not compile: {e}", origin.name()))?;
        const CHATML_END: &str = "<|im_end|>";
        let end_of_turn = (origin == TemplateOrigin::Default
            && tokenizer.piece_id(CHATML_END).is_none())
        .then_some(CHATML_END);
        Ok(Self {
            template,
            source: source.to_string(),
            tools: ToolSyntax::of_template(source),
            origin,
            end_of_turn,
            special_tokens_in_messages: false,
        })
    }

    /// Makes a rendering of more than `bytes` a 400 (`--max-rendered-bytes`).
    pub fn limit_output(&mut self, bytes: usize) {
        self.template.limit_output(bytes);
    }

    /// The prompt of a conversation: the template's output, in which the client's text
    /// cannot spell control tokens ([`PromptInput::Rendered`]) unless the operator let it
    /// ([`PromptInput::Text`]). A template that refuses the conversation (its
    /// `raise_exception`, or any error while rendering) is a 400 with its message.
    pub fn render(
        &self,
        input: &ChatInput,
        tokenizer: &Tokenizer,
    ) -> Result<PromptInput, ApiError> {
        if self.special_tokens_in_messages {
            return self.render_text(input).map(PromptInput::Text);
        }
        let escape = |v: &serde_json::Value| escape_strings(v, tokenizer);
        let escaped = ChatInput {
            messages: input.messages.iter().map(escape).collect(),
            tools: input.tools.iter().map(escape).collect(),
            template_kwargs: input
                .template_kwargs
                .iter()
                .map(|(k, v)| (tokenizer.escape_specials(k).into_owned(), escape(v)))
                .collect(),
            add_generation_prompt: input.add_generation_prompt,
            continue_final_message: input.continue_final_message,
            images: Vec::new(),
        };
        self.render_text(&escaped).map(PromptInput::Rendered)
    }

    /// The template's output over `input` as it is.
    fn render_text(&self, input: &ChatInput) -> Result<String, ApiError> {
        let described;
        let has_calls = || input.messages.iter().any(|m| m.get("tool_calls").is_some());
        let (messages, tools) = if self.tools.template_renders_tools {
            let tools = Some(input.tools.as_slice()).filter(|t| !t.is_empty());
            (input.messages.as_slice(), tools)
        } else if !input.tools.is_empty() || has_calls() {
            // The template would drop the tools and the earlier calls.
            described = with_tools_described(&input.messages, &input.tools);
            (described.as_slice(), None)
        } else {
            (input.messages.as_slice(), None)
        };
        let mut text = self
            .template
            .render(&Conversation {
                messages,
                tools,
                add_generation_prompt: input.add_generation_prompt,
                extra: Some(&input.template_kwargs),
            })
            .map_err(|e| {
                ApiError::invalid(
                    "messages",
                    format!("the model's chat template cannot render these messages: {e}"),
                )
            })?;
        if input.continue_final_message {
            // The prompt ends where the last message's text does, leaving it open.
            let last = input
                .messages
                .last()
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default();
            match text.rfind(last).filter(|_| !last.is_empty()) {
                Some(at) => text.truncate(at + last.len()),
                None => {
                    return Err(ApiError::invalid(
                        "continue_final_message",
                        "the last message's content must be non-empty text that the template writes out, to be continued",
                    ))
                }
            }
        }
        Ok(text)
    }
}

/// `value` with every string in it (object keys too) passed through
/// `Tokenizer::escape_specials`.
fn escape_strings(value: &serde_json::Value, tokenizer: &Tokenizer) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) => Value::String(tokenizer.escape_specials(s).into_owned()),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| escape_strings(v, tokenizer)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    (
                        tokenizer.escape_specials(k).into_owned(),
                        escape_strings(v, tokenizer),
                    )
                })
                .collect(),
        ),
        other => other.clone(),
    }
}
