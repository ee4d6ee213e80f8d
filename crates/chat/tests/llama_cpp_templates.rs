//! Prompts rendered from chat messages equal llama.cpp's server's for the same template,
//! special tokens and messages (fixtures/chat, made by fixtures/chat/make_chat.py).

use std::path::Path;

use ferrite_chat::{ChatTemplate, Conversation, SpecialTokens, CHATML};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/chat")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn check(name: &str) {
    let f = fixture(name);
    let source = f["template"].as_str().unwrap_or(CHATML);
    let tokens = SpecialTokens {
        bos: f["bos_token"].as_str().unwrap().into(),
        eos: f["eos_token"].as_str().unwrap().into(),
        add_bos: f["add_bos"].as_bool().unwrap(),
        add_eos: f["add_eos"].as_bool().unwrap(),
    };
    let template = ChatTemplate::new(source, tokens).unwrap();
    let cases = f["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let messages = case["messages"].as_array().unwrap();
        let tools = case.get("tools").map(|t| t.as_array().unwrap().as_slice());
        let got = template
            .render(&Conversation {
                messages,
                tools,
                add_generation_prompt: true,
                extra: None,
            })
            .unwrap();
        assert_eq!(
            got,
            case["prompt"].as_str().unwrap(),
            "{name}: {messages:?}"
        );
    }
}

#[test]
fn smollm2_template_renders_as_llama_cpp() {
    check("smollm2-135m.json");
}

#[test]
fn a_model_without_a_template_gets_llama_cpps_chatml() {
    check("gemma3-270m.json");
}

#[test]
fn llama3_template_renders_as_llama_cpp() {
    // Its BOS comes from the template and goes again, as the tokenizer adds one.
    check("llama3.json");
}

#[test]
fn qwen3_template_renders_tools_calls_and_results_as_llama_cpp() {
    check("qwen3.json");
}
