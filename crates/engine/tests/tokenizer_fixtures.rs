//! Our tokenizers give llama.cpp's ids for every fixture string, for both models.

mod common;

use ferrite_engine::gguf::GgufFile;
use ferrite_engine::tokenizer::Tokenizer;

#[test]
fn tokenizers_match_llama_cpp() {
    for (model, fixture) in common::MODELS {
        let gguf = GgufFile::open(&common::model_path(model)).unwrap();
        let tok = Tokenizer::from_gguf(&gguf.meta).unwrap();
        let data = common::fixture(fixture);
        let cases = data["tokenize_without_special"].as_array().unwrap();
        assert_eq!(cases.len(), 23, "{model}: fixture has 23 strings");
        let mut failures = Vec::new();
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = common::ids(&case["ids"]);
            let got = tok.encode(text, true);
            if got != want {
                failures.push(format!("{model} {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
            // Decoding gives the text back (these strings hold no special tokens but one).
            if !text.contains("<|endoftext|>") {
                assert_eq!(tok.decode(&got, false), text, "{model}: round trip");
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        for case in data["greedy_16"].as_array().unwrap() {
            let prompt = case["prompt"].as_str().unwrap();
            let want: Vec<u32> = common::ids(&case["prompt_ids_with_special"]);
            assert_eq!(
                tok.encode_prompt(prompt),
                want,
                "{model}: prompt {prompt:?}"
            );
        }
    }
}
