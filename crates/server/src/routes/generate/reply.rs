//! The two shapes of an answer. Both routes generate the same way; what differs is how a
//! finished choice, or a piece of one in a stream, is written: as a text completion's
//! `text`, or as a chat message whose text may hold tool calls.

use ferrite_chat::tools::{parse_json_calls, ParsedCall, ParsedOutput, ToolStream, ToolSyntax};
use ferrite_engine::tokenizer::Tokenizer;
use ferrite_protocol::{ChatLogprobs, FunctionCall, TokenLogprob, ToolCall, TopLogprob};

use super::logprobs::LedgerToken;

/// Which API the answer is for.
#[derive(Debug, Clone)]
pub(super) enum Dialect {
    /// `POST /v1/completions`.
    Text,
    /// `POST /v1/chat/completions`, with how its text becomes a message.
    Chat(ToolOutput),
}

/// How a chat choice's text becomes its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ToolOutput {
    /// All of it is content.
    None,
    /// Calls in the model's syntax may come among the text (`tool_choice: auto`); with
    /// `parallel` false only the first counts.
    Parse {
        /// The syntax the template teaches.
        syntax: ToolSyntax,
        /// `parallel_tool_calls`.
        parallel: bool,
    },
    /// The output is a call or an array of calls, `{"name", "arguments"}` (`required`).
    Calls {
        /// `parallel_tool_calls`.
        parallel: bool,
    },
    /// The output is the arguments of this function (`tool_choice` names it).
    Arguments(String),
}

impl ToolOutput {
    /// Whether only one call may count.
    fn single(&self) -> bool {
        matches!(
            self,
            Self::Parse {
                parallel: false,
                ..
            } | Self::Calls { parallel: false }
        )
    }
}

/// A chat choice's text on its way to becoming a message: content that can go out at
/// once, and calls held to the end.
#[derive(Debug)]
pub(super) struct MessageBuilder {
    output: ToolOutput,
    stream: Option<ToolStream>,
    /// The whole output, where it is a call.
    whole: String,
}

impl MessageBuilder {
    /// A builder for one choice.
    pub fn new(output: &ToolOutput) -> Self {
        Self {
            stream: match output {
                ToolOutput::Parse { syntax, .. } => Some(ToolStream::new(*syntax)),
                _ => None,
            },
            output: output.clone(),
            whole: String::new(),
        }
    }

    /// Takes more text; returns the content that can go out now.
    pub fn push(&mut self, text: &str) -> String {
        match (&self.output, &mut self.stream) {
            (ToolOutput::None, _) => text.to_string(),
            (ToolOutput::Parse { .. }, Some(stream)) => stream.push(text),
            _ => {
                self.whole.push_str(text);
                String::new()
            }
        }
    }

    /// The end of the choice: the content held back and the calls (the first alone
    /// without `parallel_tool_calls`).
    pub fn finish(self) -> ParsedOutput {
        let single = self.output.single();
        let mut out = self.finish_all();
        if single {
            out.calls.truncate(1);
        }
        out
    }

    fn finish_all(self) -> ParsedOutput {
        let whole = self.whole;
        let as_text = |text: String| ParsedOutput {
            content: Some(text).filter(|t| !t.is_empty()),
            calls: Vec::new(),
        };
        match self.output {
            ToolOutput::None => ParsedOutput::default(),
            ToolOutput::Parse { .. } => self.stream.map(ToolStream::finish).unwrap_or_default(),
            ToolOutput::Calls { .. } => match parse_json_calls(&whole) {
                Some(calls) => ParsedOutput {
                    content: None,
                    calls,
                },
                None => as_text(whole),
            },
            ToolOutput::Arguments(name) => {
                match serde_json::from_str::<serde_json::Value>(whole.trim()) {
                    Ok(arguments @ serde_json::Value::Object(_)) => ParsedOutput {
                        content: None,
                        calls: vec![ParsedCall {
                            name,
                            arguments: arguments.to_string(),
                        }],
                    },
                    _ => as_text(whole),
                }
            }
        }
    }

    /// A whole output as a message: its content (`None` when there are calls and no
    /// other text) and its calls.
    pub fn whole(output: &ToolOutput, text: &str) -> (Option<String>, Vec<ParsedCall>) {
        let mut builder = Self::new(output);
        let early = builder.push(text);
        let out = builder.finish().after(&early);
        // Without calls the content is text, if empty.
        let content = out
            .content
            .or_else(|| out.calls.is_empty().then(String::new));
        (content, out.calls)
    }
}

/// Calls as the API writes them, each with a fresh id.
pub(super) fn tool_calls(calls: Vec<ParsedCall>) -> Vec<ToolCall> {
    calls
        .into_iter()
        .map(|c| ToolCall {
            id: format!("call_{:024x}", rand::random::<u128>() >> 32),
            kind: "function".into(),
            function: FunctionCall {
                name: c.name,
                arguments: c.arguments,
            },
        })
        .collect()
}

/// A chat finish reason: `tool_calls` when the model stopped after calling tools, but
/// `stop` for a call of the function `tool_choice` named, as OpenAI answers it.
pub(super) fn chat_finish_reason(reason: String, called: bool, output: &ToolOutput) -> String {
    if called && reason == "stop" && !matches!(output, ToolOutput::Arguments(_)) {
        "tool_calls".into()
    } else {
        reason
    }
}

/// Chat `logprobs` of generated tokens: each token's text, log-probability and bytes,
/// with up to `alternatives` of the most likely tokens.
pub(super) fn chat_logprobs(
    tokenizer: &Tokenizer,
    tokens: &[LedgerToken],
    alternatives: usize,
    tokens_as_ids: bool,
) -> ChatLogprobs {
    let spell = |id: u32| {
        let bytes = tokenizer.token_bytes(id, true);
        let token = if tokens_as_ids {
            format!("token_id:{id}")
        } else {
            String::from_utf8_lossy(&bytes).into_owned()
        };
        (token, bytes)
    };
    let content = tokens
        .iter()
        .filter(|t| !t.prompt)
        .map(|t| {
            let (token, bytes) = spell(t.id);
            let top_logprobs = t
                .top
                .iter()
                .flatten()
                .take(alternatives)
                .map(|&(alt, logprob)| {
                    let (token, bytes) = spell(alt);
                    TopLogprob {
                        token,
                        logprob,
                        bytes,
                    }
                })
                .collect();
            TokenLogprob {
                token,
                logprob: t.logprob.unwrap_or(f32::NEG_INFINITY).max(-9999.0),
                bytes,
                top_logprobs,
            }
        })
        .collect();
    ChatLogprobs {
        content,
        refusal: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_calls_and_arguments_become_calls() {
        let (content, calls) = MessageBuilder::whole(
            &ToolOutput::Calls { parallel: true },
            r#"[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]"#,
        );
        assert_eq!(content, None);
        assert_eq!(
            calls
                .iter()
                .map(|c| (c.name.as_str(), c.arguments.as_str()))
                .collect::<Vec<_>>(),
            [("f", r#"{"a":1}"#), ("g", "{}")]
        );
        let (content, calls) =
            MessageBuilder::whole(&ToolOutput::Arguments("f".into()), r#"{"city": "Paris"}"#);
        assert_eq!(
            (content, calls[0].arguments.as_str()),
            (None, r#"{"city":"Paris"}"#)
        );
        // Cut off by max_tokens: not a call, the text stays.
        let (content, calls) =
            MessageBuilder::whole(&ToolOutput::Arguments("f".into()), r#"{"city": "Pa"#);
        assert_eq!(
            (content.as_deref(), calls.len()),
            (Some(r#"{"city": "Pa"#), 0)
        );
        let (content, calls) = MessageBuilder::whole(&ToolOutput::None, "<tool_call>{}");
        assert_eq!(
            (content.as_deref(), calls.len()),
            (Some("<tool_call>{}"), 0)
        );
    }

    #[test]
    fn without_parallel_calls_the_first_counts() {
        let two = r#"<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g", "arguments": {}}</tool_call>"#;
        let parse = |parallel| ToolOutput::Parse {
            syntax: ToolSyntax::Hermes,
            parallel,
        };
        assert_eq!(MessageBuilder::whole(&parse(true), two).1.len(), 2);
        let (_, calls) = MessageBuilder::whole(&parse(false), two);
        assert_eq!(
            calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["f"]
        );
    }

    #[test]
    fn a_call_ends_with_tool_calls_unless_cut_or_named() {
        let auto = ToolOutput::Parse {
            syntax: ToolSyntax::Hermes,
            parallel: true,
        };
        assert_eq!(chat_finish_reason("stop".into(), true, &auto), "tool_calls");
        assert_eq!(chat_finish_reason("length".into(), true, &auto), "length");
        assert_eq!(chat_finish_reason("stop".into(), false, &auto), "stop");
        let named = ToolOutput::Arguments("f".into());
        assert_eq!(chat_finish_reason("stop".into(), true, &named), "stop");
        let calls = tool_calls(vec![ParsedCall {
            name: "f".into(),
            arguments: "{}".into(),
        }]);
        assert!(
            calls[0].id.starts_with("call_") && calls[0].id.len() == 29,
            "{}",
            calls[0].id
        );
    }
}
