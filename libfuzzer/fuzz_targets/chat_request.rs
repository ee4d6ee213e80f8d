//! libFuzzer target: any bytes as the body of `POST /v1/chat/completions`, parsed and
//! validated with and without `--ignore-unknown-fields`, then, when it parses, rendered
//! with both real models' chat templates (SmolLM2's ChatML and Gemma 3's), each as the
//! server renders it (the client's text escaped so that it cannot spell control tokens)
//! and with `--special-tokens-in-messages`, and the prompt tokenized. Every input must give
//! a prompt or a 4xx error whose body serializes; a panic or a crash is a finding. Tool
//! schemas are checked as the parser checks them (their references, names, the grammar a
//! tool choice makes); the `constraint` target compiles grammars. Seeds:
//! `corpus/chat_request/` (conversations with content parts, tool calls and tool results,
//! every tool choice, `chat_template_kwargs`, schemas with patterns and references).
//!
//!     ferrite pull smollm2-135m && ferrite pull gemma3-270m
//!     cargo fuzz run --fuzz-dir libfuzzer --sanitizer none chat_request WORK_DIR libfuzzer/corpus/chat_request -- -max_total_time=600 -timeout=10

#![no_main]

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use ferrite_engine::gguf::GgufFile;
use ferrite_engine::tokenizer::Tokenizer;
use ferrite_server::chat::ChatSetup;
use ferrite_server::error::ApiError;
use ferrite_server::validate::{parse_chat_body, FieldLimits, PromptInput};

/// Each model's tokenizer with its chat setup as the server builds it, and one that lets
/// messages spell control tokens.
fn setups() -> &'static [(Arc<Tokenizer>, ChatSetup, ChatSetup)] {
    static SETUPS: OnceLock<Vec<(Arc<Tokenizer>, ChatSetup, ChatSetup)>> = OnceLock::new();
    SETUPS.get_or_init(|| {
        let home = std::env::var_os("FERRITE_HOME").map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/ferrite")
        });
        ["smollm2-135m", "gemma3-270m"]
            .iter()
            .map(|name| {
                let path = home.join(format!("models/{name}.gguf"));
                let gguf = GgufFile::open(&path).expect("run `ferrite pull` for both models first");
                let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf.meta).expect("a tokenizer"));
                let escaped = ChatSetup::new(&tokenizer, None).expect("the model's template");
                let mut raw = ChatSetup::new(&tokenizer, None).expect("the model's template");
                raw.special_tokens_in_messages = true;
                (tokenizer, escaped, raw)
            })
            .collect()
    })
}

/// A 4xx whose body serializes, or a finding.
fn client_error(e: &ApiError) {
    let body = serde_json::to_string(&e.body()).expect("error bodies serialize");
    assert!(body.contains("\"message\""));
    assert!(e.status().is_client_error(), "{e:?}");
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    for ignore_unknown in [false, true] {
        let params = match parse_chat_body(data, ignore_unknown, &FieldLimits::DEFAULT) {
            Ok(params) => params,
            Err(e) => {
                client_error(&e);
                continue;
            }
        };
        let input = params.input;
        for (tokenizer, escaped, raw) in setups() {
            for setup in [escaped, raw] {
                match setup.render(&input, tokenizer) {
                    Ok(PromptInput::Rendered(text)) => {
                        let never = AtomicBool::new(false);
                        tokenizer.encode_rendered_until(&text, true, &never).expect("never cancelled");
                    }
                    Ok(PromptInput::Text(text)) => {
                        tokenizer.encode_prompt(&text);
                    }
                    Ok(PromptInput::Tokens(_)) => unreachable!("a template renders text"),
                    Err(e) => client_error(&e),
                }
            }
        }
    }
});
