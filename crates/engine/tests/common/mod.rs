//! Helpers shared by the real-model tests: where the pulled models and llama.cpp's
//! reference fixtures are.

#![allow(dead_code)]

pub mod gguf_bytes;

use std::path::PathBuf;

use ferrite_engine::gguf::GgufFile;
use ferrite_engine::scheduler::SchedulerConfig;
use ferrite_engine::tokenizer::Tokenizer;
use ferrite_engine::{model, Engine, EngineConfig};

/// ferrite's home: `$FERRITE_HOME`, else `~/.cache/ferrite`.
pub fn home() -> PathBuf {
    std::env::var_os("FERRITE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/ferrite")
        })
}

/// The model cache, as `ferrite pull` fills it.
pub fn model_path(name: &str) -> PathBuf {
    let path = home().join("models").join(format!("{name}.gguf"));
    assert!(
        path.exists(),
        "{} is missing: run `cargo run --release -- pull {name}` first",
        path.display()
    );
    path
}

/// llama.cpp's reference data, from the repository's `fixtures/` (see its README).
pub fn fixture(file: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// The JSON files of a folder of `fixtures/` (`synth`, `formats`), sorted.
pub fn fixture_files(folder: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(folder);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

/// A JSON array of token ids.
pub fn ids(value: &serde_json::Value) -> Vec<u32> {
    value
        .as_array()
        .expect("an array of token ids")
        .iter()
        .map(|v| v.as_u64().expect("a token id") as u32)
        .collect()
}

/// The two models and their fixture files.
pub const MODELS: [(&str, &str); 2] = [
    ("smollm2-135m", "smollm2-135m-q4_1.llamacpp.json"),
    ("gemma3-270m", "gemma3-270m-q4_k_m.llamacpp.json"),
];

/// The engine settings the tests start from (each changes what it is about): 16
/// sequences, 512-token steps, 65,536 KV positions, a 2048-token context, no prefix cache,
/// 1024 waiting requests, no prompt lookup, 30 s for a stalled reader, and the default
/// bounds on unread events, scored logits and grammar regexes.
pub fn config() -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            max_running: 16,
            max_step_tokens: 512,
            kv_budget: 1 << 16,
        },
        context_length: 2048,
        prefix_cache_positions: 0,
        max_waiting: 1024,
        prompt_lookup: None,
        stalled_reader_timeout: std::time::Duration::from_secs(30),
        max_unread_events: ferrite_engine::sequence::DEFAULT_MAX_UNREAD_EVENTS,
        scored_logits_bytes: ferrite_engine::DEFAULT_SCORED_LOGITS_BYTES,
        max_regex_match_bytes: ferrite_engine::constrain::regexes::DEFAULT_MAX_REGEX_MATCH_BYTES,
    }
}

/// Starts an engine on a pulled model.
pub fn start_engine(name: &str, config: EngineConfig) -> Engine {
    let mut gguf = GgufFile::open(&model_path(name)).unwrap();
    let tokenizer = Tokenizer::from_gguf(&gguf.meta).unwrap();
    let model = model::load(&mut gguf).unwrap();
    Engine::start(model, tokenizer, config)
}

/// How a recorded greedy case replayed: the steps whose token was the argmax (up to the
/// first that was not, which is `mismatch`: ferrite's token and the fixture's), and the
/// largest log-probability difference among them (steps whose fixture has one:
/// llama-server leaves out a token ending inside a UTF-8 character).
pub struct GreedyReplay {
    pub matched: usize,
    pub worst_logprob_diff: f32,
    pub mismatch: Option<(u32, u32)>,
}

impl GreedyReplay {
    /// Every step matched with log-probabilities within `tolerance`, or what did not.
    pub fn check(&self, tolerance: f32) -> Result<f32, String> {
        if let Some((got, want)) = self.mismatch {
            return Err(format!("token {}: {got}, llama.cpp {want}", self.matched));
        }
        if self.worst_logprob_diff > tolerance {
            return Err(format!("logprob off by {}", self.worst_logprob_diff));
        }
        Ok(self.worst_logprob_diff)
    }
}

/// Replays one recorded greedy case (`steps`, each with `id` and `logprob`) on `model` from
/// an empty cache, feeding each argmax back, until a step's token is not the argmax.
pub fn replay_greedy(
    model: &dyn model::Model,
    prompt: &[u32],
    steps: &[serde_json::Value],
) -> Result<GreedyReplay, String> {
    use ferrite_engine::model::{BatchEntry, Logits};
    use ferrite_engine::sampling::{argmax, log_softmax};
    let mut cache = model.new_cache(prompt.len() + steps.len());
    let mut input = prompt.to_vec();
    let mut replay = GreedyReplay {
        matched: 0,
        worst_logprob_diff: 0.0,
        mismatch: None,
    };
    for step in steps {
        let logits = model
            .forward(&mut [BatchEntry {
                tokens: &input,
                cache: &mut cache,
                logits: Logits::Last,
                prompt_len: prompt.len(),
                images: Vec::new(),
                grids: Vec::new(),
            }])
            .map_err(|e| e.to_string())?
            .remove(0);
        let logprobs = log_softmax(&logits);
        let best = argmax(&logprobs) as u32;
        let want = step["id"].as_u64().unwrap() as u32;
        if best != want {
            replay.mismatch = Some((best, want));
            break;
        }
        if let Some(want) = step["logprob"].as_f64() {
            let diff = (logprobs[best as usize] - want as f32).abs();
            replay.worst_logprob_diff = replay.worst_logprob_diff.max(diff);
        }
        replay.matched += 1;
        input = vec![best];
    }
    Ok(replay)
}
