//! libFuzzer target: any bytes as a GGUF file, read, tokenizer built and used, model
//! loaded, and a forward step run on whatever loads. A panic (one inside candle that the
//! loader catches included) or a crash is a finding. Seeds: `corpus/gguf/`
//! (complete one-layer llama and gemma3 models, written by
//! `FERRITE_WRITE_FUZZ_SEEDS=1 cargo test -p ferrite-engine --test fuzz_gguf`).
//!
//!     cargo fuzz run --fuzz-dir libfuzzer --sanitizer none gguf WORK_DIR libfuzzer/corpus/gguf -- -max_total_time=600

#![no_main]

use ferrite_engine::gguf::GgufFile;
use ferrite_engine::model::{self, BatchEntry, Logits};
use ferrite_engine::tokenizer::Tokenizer;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let caught = ferrite_engine::gguf::caught_panics();
    run(data);
    // A panic inside candle, caught and turned into an error, is a finding too.
    assert_eq!(
        ferrite_engine::gguf::caught_panics(),
        caught,
        "a panic inside candle was caught while loading"
    );
});

fn run(data: &[u8]) {
    let Ok(mut gguf) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    if let Ok(t) = Tokenizer::from_gguf(&gguf.meta) {
        let ids = t.encode_prompt("ab a b");
        let _ = t.decode(&ids, false);
    }
    let Ok(model) = model::load(&mut gguf) else {
        return;
    };
    let vocab = model.info().vocab_size as u32;
    let tokens: Vec<u32> = [0, 2, 4].iter().map(|t| t % vocab).collect();
    let mut cache = model.new_cache(tokens.len() + 1);
    let _ = model.forward(&mut [BatchEntry {
        tokens: &tokens,
        cache: &mut cache,
        logits: Logits::Last,
        prompt_len: tokens.len(),
        images: Vec::new(),
        grids: Vec::new(),
    }]);
}
