//! ferrite's inference engine: GGUF models, tokenizers, sampling and a continuous-batching
//! worker thread. It knows nothing of HTTP or JSON.

pub mod constrain;
pub mod error;
pub mod gguf;
mod gguf_header;
pub mod huge_pages;
pub mod kv_cache;
pub mod lookup;
pub mod model;
mod prefix_cache;
pub mod quant;
mod running;
pub mod sampling;
pub mod scheduler;
pub mod sequence;
pub mod simd;
pub mod stop;
pub mod threads;
pub mod tokenizer;
pub mod vision;
pub mod worker;

pub use lookup::MAX_DRAFT;

pub use error::EngineError;
pub use sequence::{Events, FinishReason, PromptLogprob, SequenceEvent, SequenceRequest};
pub use worker::{Engine, EngineConfig, EngineHandle, StatsSnapshot, DEFAULT_SCORED_LOGITS_BYTES};

/// ferrite's home for the unit tests that read what `scripts/test.sh` put there (the
/// models, the tokenizer vocabularies): `$FERRITE_HOME`, else `~/.cache/ferrite`.
#[cfg(test)]
pub(crate) fn test_home() -> std::path::PathBuf {
    std::env::var_os("FERRITE_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/ferrite")
        })
}
